use std::arch::x86_64::*;
use std::time::Instant;

#[target_feature(enable = "avx2,fma")]
unsafe fn f32k(a: &[f32], w: &[f32], k: usize) -> f32 {
    let mut acc = [[_mm256_setzero_ps(); 2]; 6];
    for p in 0..k {
        let b0 = _mm256_loadu_ps(w.as_ptr().add(p * 16));
        let b1 = _mm256_loadu_ps(w.as_ptr().add(p * 16 + 8));
        for r in 0..6 {
            let x = _mm256_set1_ps(*a.get_unchecked(r * k + p));
            acc[r][0] = _mm256_fmadd_ps(x, b0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(x, b1, acc[r][1]);
        }
    }
    let mut s = _mm256_setzero_ps();
    for r in 0..6 { s = _mm256_add_ps(s, _mm256_add_ps(acc[r][0], acc[r][1])); }
    let mut o = [0f32; 8]; _mm256_storeu_ps(o.as_mut_ptr(), s); o.iter().sum()
}

#[target_feature(enable = "avx2")]
unsafe fn i16k(a: &[i16], w: &[i16], k: usize) -> i32 {
    let mut acc = [[_mm256_setzero_si256(); 2]; 6];
    let steps = k / 2;
    for s in 0..steps {
        let b0 = _mm256_loadu_si256(w.as_ptr().add(s * 32) as *const __m256i);
        let b1 = _mm256_loadu_si256(w.as_ptr().add(s * 32 + 16) as *const __m256i);
        for r in 0..6 {
            let x = _mm256_set1_epi32((a.as_ptr().add(r * k) as *const i32).add(s).read_unaligned());
            acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(x, b0));
            acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(x, b1));
        }
    }
    let mut s = _mm256_setzero_si256();
    for r in 0..6 { s = _mm256_add_epi32(s, _mm256_add_epi32(acc[r][0], acc[r][1])); }
    let mut o = [0i32; 8]; _mm256_storeu_si256(o.as_mut_ptr() as *mut __m256i, s); o.iter().sum()
}

// u8 x s8 via sign trick: 4 k per i32 lane, 6 rows x 16 cols
#[target_feature(enable = "avx2")]
unsafe fn i8k(a: &[i8], w: &[i8], k: usize) -> i32 {
    let mut acc = [[_mm256_setzero_si256(); 2]; 6];
    let ones = _mm256_set1_epi16(1);
    let steps = k / 4;
    for s in 0..steps {
        let b0 = _mm256_loadu_si256(w.as_ptr().add(s * 64) as *const __m256i);
        let b1 = _mm256_loadu_si256(w.as_ptr().add(s * 64 + 32) as *const __m256i);
        for r in 0..6 {
            let x = _mm256_set1_epi32((a.as_ptr().add(r * k) as *const i32).add(s).read_unaligned());
            let ax = _mm256_sign_epi8(x, x);
            let s0 = _mm256_sign_epi8(b0, x);
            let s1 = _mm256_sign_epi8(b1, x);
            acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(ax, s0), ones));
            acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(ax, s1), ones));
        }
    }
    let mut s = _mm256_setzero_si256();
    for r in 0..6 { s = _mm256_add_epi32(s, _mm256_add_epi32(acc[r][0], acc[r][1])); }
    let mut o = [0i32; 8]; _mm256_storeu_si256(o.as_mut_ptr() as *mut __m256i, s); o.iter().sum()
}


// u8 activations x s7 weights: no sign ops (pairs stay under i16 saturation)
#[target_feature(enable = "avx2")]
unsafe fn u8k(a: &[u8], w: &[i8], k: usize) -> i32 {
    let mut acc = [[_mm256_setzero_si256(); 2]; 6];
    let ones = _mm256_set1_epi16(1);
    let steps = k / 4;
    for s in 0..steps {
        let b0 = _mm256_loadu_si256(w.as_ptr().add(s * 64) as *const __m256i);
        let b1 = _mm256_loadu_si256(w.as_ptr().add(s * 64 + 32) as *const __m256i);
        for r in 0..6 {
            let x = _mm256_set1_epi32((a.as_ptr().add(r * k) as *const i32).add(s).read_unaligned());
            acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(x, b0), ones));
            acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(x, b1), ones));
        }
    }
    let mut s = _mm256_setzero_si256();
    for r in 0..6 { s = _mm256_add_epi32(s, _mm256_add_epi32(acc[r][0], acc[r][1])); }
    let mut o = [0i32; 8]; _mm256_storeu_si256(o.as_mut_ptr() as *mut __m256i, s); o.iter().sum()
}
// u8 x s7, two steps summed in i16 before widening (pairs <= 2*255*63 = 32130: the sum of two can overflow; timing only)
#[target_feature(enable = "avx2")]
unsafe fn u8k2(a: &[u8], w: &[i8], k: usize) -> i32 {
    let mut acc = [[_mm256_setzero_si256(); 2]; 6];
    let ones = _mm256_set1_epi16(1);
    let steps = k / 8;
    for s in 0..steps {
        let b0 = _mm256_loadu_si256(w.as_ptr().add(s * 128) as *const __m256i);
        let b1 = _mm256_loadu_si256(w.as_ptr().add(s * 128 + 32) as *const __m256i);
        let b2 = _mm256_loadu_si256(w.as_ptr().add(s * 128 + 64) as *const __m256i);
        let b3 = _mm256_loadu_si256(w.as_ptr().add(s * 128 + 96) as *const __m256i);
        for r in 0..6 {
            let x = _mm256_set1_epi32((a.as_ptr().add(r * k) as *const i32).add(2*s).read_unaligned());
            let y = _mm256_set1_epi32((a.as_ptr().add(r * k) as *const i32).add(2*s+1).read_unaligned());
            acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(x, b0), _mm256_maddubs_epi16(y, b2)), ones));
            acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(x, b1), _mm256_maddubs_epi16(y, b3)), ones));
        }
    }
    let mut s = _mm256_setzero_si256();
    for r in 0..6 { s = _mm256_add_epi32(s, _mm256_add_epi32(acc[r][0], acc[r][1])); }
    let mut o = [0i32; 8]; _mm256_storeu_si256(o.as_mut_ptr() as *mut __m256i, s); o.iter().sum()
}
fn main() {
    let k = 384;
    let a: Vec<f32> = (0..6 * k).map(|i| (i % 7) as f32).collect();
    let w: Vec<f32> = (0..16 * k).map(|i| (i % 5) as f32).collect();
    let a16: Vec<i16> = (0..6 * k).map(|i| (i % 7) as i16).collect();
    let w16: Vec<i16> = (0..16 * k).map(|i| (i % 5) as i16).collect();
    let a8: Vec<i8> = (0..6 * k).map(|i| (i % 7) as i8 - 3).collect();
    let w8: Vec<i8> = (0..16 * k).map(|i| (i % 5) as i8 - 2).collect();
    let iters = 200_000;
    let macs = (iters * 6 * 16 * k) as f64;
    for _ in 0..2 {
        let t = Instant::now(); let mut s = 0f32;
        for _ in 0..iters { s += unsafe { f32k(std::hint::black_box(&a), &w, k) }; }
        let e = t.elapsed().as_secs_f64(); println!("f32 fma: {:.1} GMAC/s ({s})", macs / e / 1e9);
        let t = Instant::now(); let mut s = 0i64;
        for _ in 0..iters { s += unsafe { i16k(std::hint::black_box(&a16), &w16, k) } as i64; }
        let e = t.elapsed().as_secs_f64(); println!("i16 madd: {:.1} GMAC/s ({s})", macs / e / 1e9);
        let t = Instant::now(); let mut s = 0i64;
        for _ in 0..iters { s += unsafe { i8k(std::hint::black_box(&a8), &w8, k) } as i64; }
        let e = t.elapsed().as_secs_f64(); println!("i8 sign+maddubs: {:.1} GMAC/s ({s})", macs / e / 1e9);
        let au: Vec<u8> = a8.iter().map(|&v| (v as i16 + 128) as u8).collect();
        let t = Instant::now(); let mut s = 0i64;
        for _ in 0..iters { s += unsafe { u8k(std::hint::black_box(&au), &w8, k) } as i64; }
        let e = t.elapsed().as_secs_f64(); println!("u8 x s7 maddubs: {:.1} GMAC/s ({s})", macs / e / 1e9);
        let t = Instant::now(); let mut s = 0i64;
        for _ in 0..iters { s += unsafe { u8k2(std::hint::black_box(&au), &w8, k) } as i64; }
        let e = t.elapsed().as_secs_f64(); println!("u8 x s7 maddubs 2-step: {:.1} GMAC/s ({s})", macs / e / 1e9);
    }
}

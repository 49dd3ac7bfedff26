//! The f16 matmul on matrix units, through wgpu's cooperative matrices
//! (`EXPERIMENTAL_COOPERATIVE_MATRIX`: 16x16x16 f16 products accumulated in f32), generated
//! per block tile and operand layout.
//!
//! A workgroup of 256 invocations (8 subgroups of 32) computes a `bm x bn` block of the
//! output; the subgroups stand in a `wm x wn` grid, each owning a `bm / wm x bn / wn` piece
//! as `fm x fn` 16x16 f32 accumulators (128x128: 64x32 pieces, 4x2 accumulators; 128x64 and
//! 64x128: 32x32, 2x2; 64x64: 16x32, 1x2). K is walked in `bk`-deep slices (16 or 32).
//!
//! **Staging.** Each slice of A (`bm x bk`) and B (`bk x bn`) goes from global memory into
//! registers and from there into workgroup memory as f16, in two buffers: the loads of
//! slice `t + 1` are issued before the products of slice `t` (which read the other buffer),
//! and stored after them, so a slice costs one barrier. Rows along K are padded by 8
//! elements (`bk + 8`: consecutive rows start 4 banks apart, so the matrix loads of 16-byte
//! row pieces meet no bank conflicts; pointers and strides stay multiples of 16 bytes, as
//! Vulkan asks of cooperative-matrix loads). A is kept row-major (`coopLoadT`); B is kept
//! the way it lies in memory: column-major (`[n][k]`, `coopLoad`) when adjacent along K (the
//! models' `W^T`) or in the generic layout, row-major (`[k][n]`, `coopLoadT`) when adjacent
//! along N. Elements outside the matrix are staged as zeros, so ragged edges need no other
//! care.
//!
//! **Layouts** ([`Layout`], chosen at launch as for the FMA kernels): aligned operands
//! (offsets, strides, K and N multiples of 4) are bound as `array<vec4<f16>>` and loaded
//! four elements at a time; the generic variant loads scalars, walking whichever dimension is
//! adjacent in memory.
//!
//! **Epilogue.** Each accumulator goes through a 16x16 f32 scratch of its subgroup in
//! workgroup memory; each invocation then takes 8 adjacent outputs of one row, adds the bias,
//! applies the activation (`shaders/epilogue.wgsl`) and stores them (`vec4`s when aligned).
//!
//! **Emulation** ([`Spec::emulate`]): the same kernel with the four matrix operations
//! written out in plain WGSL over the same workgroup tiles (a "subgroup" is 32 consecutive
//! invocations; each holds 8 adjacent elements of a row of every accumulator): it runs on
//! any adapter with `SHADER_F16` (lavapipe in CI), so the staging, the double buffering,
//! the edges, the layouts and the epilogue are checked against float64 where no matrix
//! units exist. What it cannot check is the driver's matrix operations themselves.

pub(crate) use super::blocked::Layout;

/// One generated kernel: block tile `bm x bn`, slice depth `bk`, operand layout, and whether
/// the matrix operations are emulated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Spec {
    pub(crate) bm: u32,
    pub(crate) bn: u32,
    pub(crate) bk: u32,
    pub(crate) layout: Layout,
    pub(crate) emulate: bool,
}

/// Block tiles the generator accepts: `bm`, `bn` in {64, 128}, `bk` in {16, 32}.
pub(crate) fn valid(bm: u32, bn: u32, bk: u32) -> bool {
    [64, 128].contains(&bm) && [64, 128].contains(&bn) && [16, 32].contains(&bk)
}

/// Workgroup-memory bytes of the scratch the accumulators go out through (8 x 16x16 f32).
const SCRATCH_BYTES: u32 = 8 * 256 * 4;

impl Spec {
    pub(crate) fn label(&self) -> String {
        let emu = if self.emulate { " emulated" } else { "" };
        format!(
            "matmul coop {}x{}x{} {:?}{emu}",
            self.bm, self.bn, self.bk, self.layout
        )
    }

    /// The subgroup grid `(wm, wn)` over the block.
    fn grid(&self) -> (u32, u32) {
        if self.bn == 128 {
            (2, 4)
        } else {
            (4, 2)
        }
    }

    /// Stride (elements) of a staged row along K.
    fn sk(&self) -> u32 {
        self.bk + 8
    }

    /// Whether B is staged row-major (`[k][n]`): only when adjacent along N in memory.
    fn b_rows(&self) -> bool {
        self.layout == Layout::BAlongN
    }

    /// f16 elements of one buffer of the A and of the B tile.
    fn tile_elems(&self) -> (u32, u32) {
        let a = self.bm * self.sk();
        let b = if self.b_rows() {
            self.bk * (self.bn + 8)
        } else {
            self.bn * self.sk()
        };
        (a, b)
    }

    /// Workgroup memory the kernel declares, in bytes (two buffers of each tile, f16, and
    /// the scratch); a launch takes a spec only where the device allows this much.
    pub(crate) fn workgroup_bytes(&self) -> u32 {
        let (a, b) = self.tile_elems();
        2 * 2 * (a + b) + SCRATCH_BYTES
    }

    /// The WGSL body (after the header, `prelude.wgsl` and `epilogue.wgsl`).
    pub(crate) fn source(&self) -> String {
        use std::fmt::Write;
        let Spec { bm, bn, bk, .. } = *self;
        assert!(valid(bm, bn, bk), "coop matmul {bm}x{bn}x{bk}");
        let g = self.geometry();
        let (a_elems, b_elems) = (g.a_elems, g.b_elems);
        let elem = if g.aligned { "vec4<T>" } else { "T" };
        let (load, stage, mma) = (self.load(&g), self.stage(&g), self.mma(&g));
        let mut s = String::new();
        let w = &mut s;
        // `write!` into a String cannot fail.
        macro_rules! l {
            ($($t:tt)*) => {{ let _ = writeln!(w, $($t)*); }};
        }
        l!("@group(0) @binding(1) var<storage, read> a: array<{elem}>;");
        l!("@group(0) @binding(2) var<storage, read> b: array<{elem}>;");
        l!("@group(0) @binding(3) var<storage, read_write> out: array<{elem}>;");
        l!("var<workgroup> sa: array<f16, {}>;", 2 * a_elems);
        l!("var<workgroup> sb: array<f16, {}>;", 2 * b_elems);
        l!("var<workgroup> sc: array<f32, 2048>;");
        l!("@compute @workgroup_size(256)");
        // On matrix units, the subgroup and the lane are the driver's; emulated, invocations
        // in runs of 32.
        let subgroups = if self.emulate {
            ""
        } else {
            ",\n        @builtin(subgroup_id) sg: u32, @builtin(subgroup_invocation_id) lane: u32"
        };
        l!("fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32{subgroups}) {{");
        if self.emulate {
            l!("let sg = li / 32u; let lane = li % 32u;");
        }
        w.push_str(&self.setup(&g));
        // Slice 0 into buffer 0, then one barrier a slice (see the module docs).
        l!("var k0 = 0u;");
        w.push_str(&load);
        l!("{{ let nxa = 0u; let nxb = 0u;");
        w.push_str(&stage);
        l!("}}");
        l!("workgroupBarrier();");
        l!("let slices = (k + {}u) / {bk}u;", bk - 1);
        l!("for (var t = 0u; t < slices; t++) {{");
        l!("let ca = (t % 2u) * {a_elems}u; let cb = (t % 2u) * {b_elems}u;");
        l!("let nxa = {a_elems}u - ca; let nxb = {b_elems}u - cb;");
        l!("k0 = k0 + {bk}u;");
        w.push_str(&load);
        w.push_str(&mma);
        w.push_str(&stage);
        l!("workgroupBarrier();");
        l!("}}");
        w.push_str(&self.epilogue(&g));
        l!("}}");
        s
    }

    /// The sizes the generated code is written in (see the module docs).
    fn geometry(&self) -> Geometry {
        let Spec { bm, bn, bk, .. } = *self;
        let (wm, wn) = self.grid();
        let (sm, sn) = (bm / wm, bn / wn);
        let (a_elems, b_elems) = self.tile_elems();
        let aligned = self.layout != Layout::Generic;
        let per = if aligned { 4 } else { 1 };
        let (na, nb) = (bm * bk / per, bn * bk / per);
        // Every tile here holds a multiple of 256 values: no invocation idles in a load.
        debug_assert!(na.is_multiple_of(256) && nb.is_multiple_of(256));
        Geometry {
            wn,
            sm,
            sn,
            fm: sm / 16,
            fnn: sn / 16,
            sk: self.sk(),
            snb: bn + 8,
            a_elems,
            b_elems,
            aligned,
            ra: na / 256,
            rb: nb / 256,
        }
    }

    /// The start of the entry point: its parameters, where each invocation's loads land in
    /// the tiles, and the accumulators.
    fn setup(&self, g: &Geometry) -> String {
        use std::fmt::Write;
        let Spec {
            bm,
            bn,
            bk,
            layout,
            emulate,
        } = *self;
        let (wn, sm, sn, fm, fnn) = (g.wn, g.sm, g.sn, g.fm, g.fnn);
        let (aligned, ra, rb) = (g.aligned, g.ra, g.rb);
        let mut s = String::new();
        let w = &mut s;
        macro_rules! l {
            ($($t:tt)*) => {{ let _ = writeln!(w, $($t)*); }};
        }
        l!("let m = prm(0u); let n = prm(1u); let k = prm(2u);");
        l!("let bi = wid.z + prm(3u);");
        l!("let row0 = wid.y * {bm}u; let col0 = wid.x * {bn}u;");
        l!("let abase = prm(4u) + bi * prm(5u); let ars = prm(6u); let acs = prm(7u);");
        l!("let bbase = prm(8u) + bi * prm(9u); let brs = prm(10u); let bcs = prm(11u);");
        // The subgroup's piece of the block, and the invocation's place in an accumulator
        // (the epilogue's, and the emulation's): row `er`, columns `ec..ec + 8`.
        l!("let wm0 = (sg / {wn}u) * {sm}u; let wn0 = (sg % {wn}u) * {sn}u;");
        l!("let er = lane / 2u; let ec = (lane % 2u) * 8u;");
        if !aligned {
            l!("let a_along_k = acs == 1u;");
            l!("let b_along_k = brs == 1u && bcs != 1u;");
        }
        // Where each loaded value sits in the tile: fixed for the whole kernel.
        for r in 0..ra {
            l!("let ea{r} = {}u + li;", r * 256);
            if aligned {
                l!("let ma{r} = ea{r} / {}u;", bk / 4);
                l!("let ka{r} = (ea{r} % {}u) * 4u;", bk / 4);
                l!("var pa{r}: vec4<T>;");
            } else {
                l!("let ma{r} = select(ea{r} % {bm}u, ea{r} / {bk}u, a_along_k);");
                l!("let ka{r} = select(ea{r} / {bm}u, ea{r} % {bk}u, a_along_k);");
                l!("var pa{r}: T;");
            }
        }
        for r in 0..rb {
            l!("let eb{r} = {}u + li;", r * 256);
            match layout {
                Layout::Generic => {
                    l!("let nb{r} = select(eb{r} % {bn}u, eb{r} / {bk}u, b_along_k);");
                    l!("let kb{r} = select(eb{r} / {bn}u, eb{r} % {bk}u, b_along_k);");
                    l!("var pb{r}: T;");
                }
                Layout::AlongK => {
                    l!("let nb{r} = eb{r} / {}u;", bk / 4);
                    l!("let kb{r} = (eb{r} % {}u) * 4u;", bk / 4);
                    l!("var pb{r}: vec4<T>;");
                }
                Layout::BAlongN => {
                    l!("let nb{r} = (eb{r} % {}u) * 4u;", bn / 4);
                    l!("let kb{r} = eb{r} / {}u;", bn / 4);
                    l!("var pb{r}: vec4<T>;");
                }
            }
        }
        for i in 0..fm {
            for j in 0..fnn {
                if emulate {
                    l!("var c{i}_{j}_0 = vec4<f32>(0.0); var c{i}_{j}_1 = vec4<f32>(0.0);");
                } else {
                    l!("var c{i}_{j} = coop_mat16x16<f32, C>();");
                }
            }
        }
        s
    }

    /// Global loads of the slice at `k0` into the prefetch registers (zero outside).
    fn load(&self, g: &Geometry) -> String {
        use std::fmt::Write;
        let (aligned, ra, rb) = (g.aligned, g.ra, g.rb);
        let layout = self.layout;
        let mut load = String::new();
        let w = &mut load;
        macro_rules! l {
            ($($t:tt)*) => {{ let _ = writeln!(w, $($t)*); }};
        }
        let zero = if aligned { "vec4<T>(0.0)" } else { "T(0.0)" };
        for r in 0..ra {
            l!("pa{r} = {zero};");
            l!("if (row0 + ma{r} < m && k0 + ka{r} < k) {{");
            if aligned {
                l!("pa{r} = a[(abase + (row0 + ma{r}) * ars + k0 + ka{r}) / 4u];");
            } else {
                l!("pa{r} = a[abase + (row0 + ma{r}) * ars + (k0 + ka{r}) * acs];");
            }
            l!("}}");
        }
        let zero = if layout == Layout::Generic {
            "T(0.0)"
        } else {
            "vec4<T>(0.0)"
        };
        for r in 0..rb {
            l!("pb{r} = {zero};");
            l!("if (col0 + nb{r} < n && k0 + kb{r} < k) {{");
            match layout {
                Layout::Generic => {
                    l!("pb{r} = b[bbase + (k0 + kb{r}) * brs + (col0 + nb{r}) * bcs];")
                }
                Layout::AlongK => {
                    l!("pb{r} = b[(bbase + (col0 + nb{r}) * bcs + k0 + kb{r}) / 4u];")
                }
                Layout::BAlongN => {
                    l!("pb{r} = b[(bbase + (k0 + kb{r}) * brs + col0 + nb{r}) / 4u];")
                }
            }
            l!("}}");
        }
        load
    }

    /// Stores of the prefetch registers into the tile buffer at `sa[nxa..]`, `sb[nxb..]`.
    fn stage(&self, g: &Geometry) -> String {
        use std::fmt::Write;
        let (sk, snb, aligned, ra, rb) = (g.sk, g.snb, g.aligned, g.ra, g.rb);
        let mut stage = String::new();
        let w = &mut stage;
        macro_rules! l {
            ($($t:tt)*) => {{ let _ = writeln!(w, $($t)*); }};
        }
        for r in 0..ra {
            if aligned {
                l!("{{ let q = nxa + ma{r} * {sk}u + ka{r};");
                for c in 0..4 {
                    l!("sa[q + {c}u] = pa{r}[{c}];");
                }
                l!("}}");
            } else {
                l!("sa[nxa + ma{r} * {sk}u + ka{r}] = pa{r};");
            }
        }
        for r in 0..rb {
            match self.layout {
                Layout::Generic => l!("sb[nxb + nb{r} * {sk}u + kb{r}] = pb{r};"),
                Layout::AlongK => {
                    l!("{{ let q = nxb + nb{r} * {sk}u + kb{r};");
                    for c in 0..4 {
                        l!("sb[q + {c}u] = pb{r}[{c}];");
                    }
                    l!("}}");
                }
                Layout::BAlongN => {
                    l!("{{ let q = nxb + kb{r} * {snb}u + nb{r};");
                    for c in 0..4 {
                        l!("sb[q + {c}u] = pb{r}[{c}];");
                    }
                    l!("}}");
                }
            }
        }
        stage
    }

    /// The products of one slice, from the buffer at `sa[ca..]`, `sb[cb..]`.
    fn mma(&self, g: &Geometry) -> String {
        use std::fmt::Write;
        let (fm, fnn, sk, snb) = (g.fm, g.fnn, g.sk, g.snb);
        let mut mma = String::new();
        let w = &mut mma;
        macro_rules! l {
            ($($t:tt)*) => {{ let _ = writeln!(w, $($t)*); }};
        }
        // Element (kq, column `col`) of the staged B, as an index into `sb`.
        let b_at = |kq: &str, col: &str| {
            if self.b_rows() {
                format!("cb + ({kq}) * {snb}u + {col}")
            } else {
                format!("cb + ({col}) * {sk}u + {kq}")
            }
        };
        for kk in (0..self.bk).step_by(16) {
            if self.emulate {
                l!("for (var q = 0u; q < 16u; q++) {{");
                for i in 0..fm {
                    l!(
                        "let a{i} = vec4<f32>(f32(sa[ca + (wm0 + {}u + er) * {sk}u + {kk}u + q]));",
                        i * 16
                    );
                }
                for j in 0..fnn {
                    let col = |t: u32| format!("wn0 + {}u + ec + {t}u", j * 16);
                    let ld = |t: u32| format!("f32(sb[{}])", b_at(&format!("{kk}u + q"), &col(t)));
                    l!(
                        "let b{j}_0 = vec4<f32>({}, {}, {}, {});",
                        ld(0),
                        ld(1),
                        ld(2),
                        ld(3)
                    );
                    l!(
                        "let b{j}_1 = vec4<f32>({}, {}, {}, {});",
                        ld(4),
                        ld(5),
                        ld(6),
                        ld(7)
                    );
                }
                for i in 0..fm {
                    for j in 0..fnn {
                        l!("c{i}_{j}_0 = fma(a{i}, b{j}_0, c{i}_{j}_0);");
                        l!("c{i}_{j}_1 = fma(a{i}, b{j}_1, c{i}_{j}_1);");
                    }
                }
                l!("}}");
            } else {
                l!("{{");
                for i in 0..fm {
                    l!("let a{i} = coopLoadT<coop_mat16x16<f16, A>>(&sa[ca + (wm0 + {}u) * {sk}u + {kk}u], {sk}u);", i * 16);
                }
                for j in 0..fnn {
                    let col = format!("wn0 + {}u", j * 16);
                    if self.b_rows() {
                        l!(
                            "let b{j} = coopLoadT<coop_mat16x16<f16, B>>(&sb[{}], {snb}u);",
                            b_at(&format!("{kk}u"), &col)
                        );
                    } else {
                        l!(
                            "let b{j} = coopLoad<coop_mat16x16<f16, B>>(&sb[{}], {sk}u);",
                            b_at(&format!("{kk}u"), &col)
                        );
                    }
                }
                for i in 0..fm {
                    for j in 0..fnn {
                        l!("c{i}_{j} = coopMultiplyAdd(a{i}, b{j}, c{i}_{j});");
                    }
                }
                l!("}}");
            }
        }
        mma
    }

    /// The epilogue, one accumulator of every subgroup at a time.
    fn epilogue(&self, g: &Geometry) -> String {
        use std::fmt::Write;
        let (fm, fnn, aligned) = (g.fm, g.fnn, g.aligned);
        let mut s = String::new();
        let w = &mut s;
        macro_rules! l {
            ($($t:tt)*) => {{ let _ = writeln!(w, $($t)*); }};
        }
        l!("let obase = prm(12u) + bi * m * n;");
        l!("let sq = sg * 256u;");
        for i in 0..fm {
            for j in 0..fnn {
                if self.emulate {
                    for t in 0..4 {
                        l!("sc[sq + er * 16u + ec + {t}u] = c{i}_{j}_0[{t}];");
                        l!("sc[sq + er * 16u + ec + {}u] = c{i}_{j}_1[{t}];", t + 4);
                    }
                } else {
                    l!("coopStoreT(c{i}_{j}, &sc[sq], 16u);");
                }
                l!("workgroupBarrier();");
                l!("{{ let r = row0 + wm0 + {}u + er;", i * 16);
                l!("let c = col0 + wn0 + {}u + ec;", j * 16);
                l!("let q = sq + er * 16u + ec;");
                l!("let v0 = vec4<f32>(sc[q], sc[q + 1u], sc[q + 2u], sc[q + 3u]);");
                l!("let v1 = vec4<f32>(sc[q + 4u], sc[q + 5u], sc[q + 6u], sc[q + 7u]);");
                l!("if (r < m) {{");
                if aligned {
                    l!("if (c < n) {{ out[(obase + r * n + c) / 4u] = vec4<T>(epi4(v0, c)); }}");
                    l!("if (c + 4u < n) {{ out[(obase + r * n + c + 4u) / 4u] = vec4<T>(epi4(v1, c + 4u)); }}");
                } else {
                    for t in 0..8 {
                        let (v, comp) = (t / 4, ["x", "y", "z", "w"][t % 4]);
                        l!("if (c + {t}u < n) {{ out[obase + r * n + c + {t}u] = T(epi(v{v}.{comp}, c + {t}u)); }}");
                    }
                }
                l!("}} }}");
                l!("workgroupBarrier();");
            }
        }
        s
    }
}

/// The sizes a [`Spec`]'s code is written in: the subgroup grid's columns `wn`, each
/// subgroup's piece `sm x sn` as `fm x fnn` accumulators, the staged rows' strides along K
/// (`sk`) and, for B staged row-major, along N (`snb`), one buffer of each tile in
/// elements, whether the operands are `vec4`s, and the loads per invocation per slice.
#[derive(Clone, Copy)]
struct Geometry {
    wn: u32,
    sm: u32,
    sn: u32,
    fm: u32,
    fnn: u32,
    sk: u32,
    snb: u32,
    a_elems: u32,
    b_elems: u32,
    aligned: bool,
    ra: u32,
    rb: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workgroup_memory_of_each_tile() {
        let spec = |bm, bn, bk, layout| Spec {
            bm,
            bn,
            bk,
            layout,
            emulate: false,
        };
        // 128x128x32 along K: 2 x 2 x (128 + 128) x 40 f16 + 8 KiB, NVIDIA's 48 KiB exactly.
        assert_eq!(spec(128, 128, 32, Layout::AlongK).workgroup_bytes(), 49_152);
        assert_eq!(
            spec(128, 128, 32, Layout::BAlongN).workgroup_bytes(),
            46_080
        );
        assert_eq!(
            spec(128, 128, 16, Layout::Generic).workgroup_bytes(),
            32_768
        );
        assert_eq!(spec(64, 64, 16, Layout::AlongK).workgroup_bytes(), 20_480);
    }
}

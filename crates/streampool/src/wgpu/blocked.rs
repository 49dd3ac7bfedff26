//! The register-blocked matmul, generated per tile shape and operand layout.
//!
//! A workgroup of 256 invocations (16 x 16) computes a `bm x bn` block of the output; each
//! invocation `tm x tn` of it (`tm = bm / 16`, `tn = bn / 16`), held in `vec4<f32>`
//! accumulators. The K dimension is walked in `bk`-wide slices staged in workgroup memory as
//! `f32` (half inputs are widened on load) with the next slice's global loads issued into
//! registers before the current slice's products (one workgroup buffer, two barriers a
//! slice). The WGSL is written out here rather than looped over arrays: every register is
//! a named variable and every loop over the tile is unrolled, so no function-local array is
//! indexed at run time (naga would bounds-check each such index, and drivers then keep the
//! array in local memory: the reason the array-based 64x64 kernel ran at 0.9 TFLOP/s on the
//! H100).
//!
//! An invocation's rows are `g * 64 + ty * 4 + 0..4` for each group `g < tm / 4`, its columns
//! `h * 64 + tx * 4 + 0..4` (`h < tn / 4`): the workgroup reads of a product step are
//! `vec4` loads, broadcast within half-warps for A and consecutive for B, free of bank
//! conflicts, and the aligned variant stores the output as `vec4`s.
//!
//! **Aligned variant** (chosen at launch, [`Layout`]): A adjacent along K, B adjacent along K
//! (`W^T`, the models' linear layers) or along N (a row-major right operand), offsets,
//! strides, K and N multiples of 4: operands and output are bound as `array<vec4<T>>` and
//! read and written four elements at a time. **Generic variant**: any strides, scalar loads
//! walking whichever dimension is adjacent in memory (as the 16x16 kernel does).

/// How the operands are read: see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Layout {
    /// Any strides, scalar loads and stores.
    Generic,
    /// `vec4` loads of A and B along K, `vec4` stores.
    AlongK,
    /// `vec4` loads of A along K and of B along N, `vec4` stores.
    BAlongN,
}

/// One generated kernel: block tile `bm x bn`, slice depth `bk`, operand layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Spec {
    pub(crate) bm: u32,
    pub(crate) bn: u32,
    pub(crate) bk: u32,
    pub(crate) layout: Layout,
}

/// Block tiles the generator accepts: `bm`, `bn` in {64, 128}, `bk` in {4, 8, 16, 32}.
pub(crate) fn valid(bm: u32, bn: u32, bk: u32) -> bool {
    [64, 128].contains(&bm) && [64, 128].contains(&bn) && [4, 8, 16, 32].contains(&bk)
}

impl Spec {
    pub(crate) fn label(&self) -> String {
        format!(
            "matmul {}x{}x{} {:?}",
            self.bm, self.bn, self.bk, self.layout
        )
    }

    /// The WGSL body (after the storage type `T` and `prelude.wgsl`).
    pub(crate) fn source(&self) -> String {
        use std::fmt::Write;
        let Spec { bm, bn, bk, .. } = *self;
        assert!(valid(bm, bn, bk), "blocked matmul {bm}x{bn}x{bk}");
        let g = self.geometry();
        let elem = if g.aligned { "vec4<T>" } else { "T" };
        let (load, stage) = (self.load(&g), self.stage(&g));
        let mut s = String::new();
        let w = &mut s;
        // `write!` into a String cannot fail.
        macro_rules! l {
            ($($t:tt)*) => {{ let _ = writeln!(w, $($t)*); }};
        }
        l!("@group(0) @binding(1) var<storage, read> a: array<{elem}>;");
        l!("@group(0) @binding(2) var<storage, read> b: array<{elem}>;");
        l!("@group(0) @binding(3) var<storage, read_write> out: array<{elem}>;");
        l!("var<workgroup> sa: array<vec4<f32>, {}>;", bk * bm / 4);
        l!("var<workgroup> sb: array<vec4<f32>, {}>;", bk * bn / 4);
        l!("@compute @workgroup_size(256)");
        l!("fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {{");
        w.push_str(&self.setup(&g));
        l!("var k0 = 0u;");
        w.push_str(&load);
        l!("let slices = (k + {}u) / {bk}u;", bk - 1);
        l!("for (var t = 0u; t < slices; t++) {{");
        w.push_str(&stage);
        l!("workgroupBarrier();");
        l!("k0 = k0 + {bk}u;");
        w.push_str(&load);
        w.push_str(&self.products(&g));
        l!("workgroupBarrier();");
        l!("}}");
        w.push_str(&self.epilogue(&g));
        l!("}}");
        s
    }

    /// The sizes the generated code is written in (see the module docs).
    fn geometry(&self) -> Geometry {
        let Spec { bm, bn, bk, layout } = *self;
        let (tm, tn) = (bm / 16, bn / 16);
        let aligned = layout != Layout::Generic;
        // Values (vec4s when aligned) each invocation loads per slice, for A and for B.
        let per = if aligned { 4 } else { 1 };
        let (na, nb) = (bm * bk / per, bn * bk / per);
        Geometry {
            tm,
            gm: tm / 4,
            gn: tn / 4,
            aligned,
            na,
            nb,
            ra: na.div_ceil(256),
            rb: nb.div_ceil(256),
        }
    }

    /// The start of the entry point: its parameters, where each invocation's loads land in
    /// the tiles, and the accumulators.
    fn setup(&self, g: &Geometry) -> String {
        use std::fmt::Write;
        let Spec { bm, bn, bk, layout } = *self;
        let (tm, gn, aligned, ra, rb) = (g.tm, g.gn, g.aligned, g.ra, g.rb);
        let reg = if aligned { "vec4<f32>" } else { "f32" };
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
        l!("let tx = li % 16u; let ty = li / 16u;");
        if !aligned {
            l!("let a_along_k = acs == 1u;");
            l!("let b_along_k = brs == 1u && bcs != 1u;");
        }
        // Where each loaded value sits in the tile: fixed for the whole kernel.
        for r in 0..ra {
            l!("let ea{r} = {}u + li;", r * 256);
            match layout {
                Layout::Generic => {
                    l!("let ma{r} = select(ea{r} % {bm}u, ea{r} / {bk}u, a_along_k);");
                    l!("let ka{r} = select(ea{r} / {bm}u, ea{r} % {bk}u, a_along_k);");
                }
                _ => {
                    l!("let ma{r} = ea{r} / {}u;", bk / 4);
                    l!("let ka{r} = (ea{r} % {}u) * 4u;", bk / 4);
                }
            }
            l!("var pa{r}: {reg};");
        }
        for r in 0..rb {
            l!("let eb{r} = {}u + li;", r * 256);
            match layout {
                Layout::Generic => {
                    l!("let nb{r} = select(eb{r} % {bn}u, eb{r} / {bk}u, b_along_k);");
                    l!("let kb{r} = select(eb{r} / {bn}u, eb{r} % {bk}u, b_along_k);");
                }
                Layout::AlongK => {
                    l!("let nb{r} = eb{r} / {}u;", bk / 4);
                    l!("let kb{r} = (eb{r} % {}u) * 4u;", bk / 4);
                }
                Layout::BAlongN => {
                    l!("let nb{r} = (eb{r} % {}u) * 4u;", bn / 4);
                    l!("let kb{r} = eb{r} / {}u;", bn / 4);
                }
            }
            l!("var pb{r}: {reg};");
        }
        for i in 0..tm {
            for h in 0..gn {
                l!("var c{i}_{h} = vec4<f32>(0.0);");
            }
        }
        s
    }

    /// Global loads of the slice at `k0` into the prefetch registers.
    fn load(&self, g: &Geometry) -> String {
        use std::fmt::Write;
        let (aligned, na, nb, ra, rb) = (g.aligned, g.na, g.nb, g.ra, g.rb);
        let layout = self.layout;
        let zero = if aligned { "vec4<f32>(0.0)" } else { "0.0" };
        let mut load = String::new();
        let w = &mut load;
        macro_rules! l {
            ($($t:tt)*) => {{ let _ = writeln!(w, $($t)*); }};
        }
        for r in 0..ra {
            let live = if !na.is_multiple_of(256) {
                format!("ea{r} < {na}u && ")
            } else {
                String::new()
            };
            l!("pa{r} = {zero};");
            l!("if ({live}row0 + ma{r} < m && k0 + ka{r} < k) {{");
            if aligned {
                l!("pa{r} = vec4<f32>(a[(abase + (row0 + ma{r}) * ars + k0 + ka{r}) / 4u]);");
            } else {
                l!("pa{r} = f32(a[abase + (row0 + ma{r}) * ars + (k0 + ka{r}) * acs]);");
            }
            l!("}}");
        }
        for r in 0..rb {
            let live = if !nb.is_multiple_of(256) {
                format!("eb{r} < {nb}u && ")
            } else {
                String::new()
            };
            l!("pb{r} = {zero};");
            l!("if ({live}col0 + nb{r} < n && k0 + kb{r} < k) {{");
            match layout {
                Layout::Generic => {
                    l!("pb{r} = f32(b[bbase + (k0 + kb{r}) * brs + (col0 + nb{r}) * bcs]);")
                }
                Layout::AlongK => {
                    l!("pb{r} = vec4<f32>(b[(bbase + (col0 + nb{r}) * bcs + k0 + kb{r}) / 4u]);")
                }
                Layout::BAlongN => {
                    l!("pb{r} = vec4<f32>(b[(bbase + (k0 + kb{r}) * brs + col0 + nb{r}) / 4u]);")
                }
            }
            l!("}}");
        }
        load
    }

    /// Stores of the prefetch registers into the workgroup tiles (`sa[k][m]`, `sb[k][n]`).
    fn stage(&self, g: &Geometry) -> String {
        use std::fmt::Write;
        let Spec { bm, bn, layout, .. } = *self;
        let (aligned, na, nb, ra, rb) = (g.aligned, g.na, g.nb, g.ra, g.rb);
        let mut stage = String::new();
        let w = &mut stage;
        macro_rules! l {
            ($($t:tt)*) => {{ let _ = writeln!(w, $($t)*); }};
        }
        let guard = |e: &str, r: u32, total: u32| {
            if !total.is_multiple_of(256) {
                format!("if ({e}{r} < {total}u) ")
            } else {
                String::new()
            }
        };
        for r in 0..ra {
            let g = guard("ea", r, na);
            if aligned {
                for c in 0..4 {
                    l!("{g}{{ sa[((ka{r} + {c}u) * {bm}u + ma{r}) / 4u][ma{r} % 4u] = pa{r}[{c}]; }}");
                }
            } else {
                l!("{g}{{ sa[(ka{r} * {bm}u + ma{r}) / 4u][ma{r} % 4u] = pa{r}; }}");
            }
        }
        for r in 0..rb {
            let g = guard("eb", r, nb);
            match layout {
                Layout::Generic => {
                    l!("{g}{{ sb[(kb{r} * {bn}u + nb{r}) / 4u][nb{r} % 4u] = pb{r}; }}")
                }
                Layout::AlongK => {
                    for c in 0..4 {
                        l!("{g}{{ sb[((kb{r} + {c}u) * {bn}u + nb{r}) / 4u][nb{r} % 4u] = pb{r}[{c}]; }}");
                    }
                }
                Layout::BAlongN => l!("{g}{{ sb[(kb{r} * {bn}u + nb{r}) / 4u] = pb{r}; }}"),
            }
        }
        stage
    }

    /// The products of one slice: a `vec4` of A and of B per step along it, into every
    /// accumulator.
    fn products(&self, g: &Geometry) -> String {
        use std::fmt::Write;
        let Spec { bm, bn, bk, .. } = *self;
        let (gm, gn) = (g.gm, g.gn);
        let mut s = String::new();
        let w = &mut s;
        macro_rules! l {
            ($($t:tt)*) => {{ let _ = writeln!(w, $($t)*); }};
        }
        for kk in 0..bk {
            l!("{{");
            for g in 0..gm {
                l!("let a{g} = sa[{}u + ty];", (kk * bm) / 4 + g * 16);
            }
            for h in 0..gn {
                l!("let b{h} = sb[{}u + tx];", (kk * bn) / 4 + h * 16);
            }
            for g in 0..gm {
                for (c, comp) in ["x", "y", "z", "w"].iter().enumerate() {
                    let i = g * 4 + c as u32;
                    for h in 0..gn {
                        l!("c{i}_{h} = fma(vec4<f32>(a{g}.{comp}), b{h}, c{i}_{h});");
                    }
                }
            }
            l!("}}");
        }
        s
    }

    /// The stores of the accumulators through the epilogue (bias, activation).
    fn epilogue(&self, g: &Geometry) -> String {
        use std::fmt::Write;
        let (gm, gn, aligned) = (g.gm, g.gn, g.aligned);
        let mut s = String::new();
        let w = &mut s;
        macro_rules! l {
            ($($t:tt)*) => {{ let _ = writeln!(w, $($t)*); }};
        }
        l!("let obase = prm(12u) + bi * m * n;");
        for g in 0..gm {
            for c in 0..4 {
                let i = g * 4 + c;
                l!("{{ let r = row0 + {}u + ty * 4u;", g * 64 + c);
                l!("if (r < m) {{");
                for h in 0..gn {
                    l!("{{ let c = col0 + {}u + tx * 4u;", h * 64);
                    if aligned {
                        l!("if (c < n) {{ out[(obase + r * n + c) / 4u] = vec4<T>(epi4(c{i}_{h}, c)); }}");
                    } else {
                        for (j, comp) in ["x", "y", "z", "w"].iter().enumerate() {
                            l!("if (c + {j}u < n) {{ out[obase + r * n + c + {j}u] = T(epi(c{i}_{h}.{comp}, c + {j}u)); }}");
                        }
                    }
                    l!("}}");
                }
                l!("}} }}");
            }
        }
        s
    }
}

/// The sizes a [`Spec`]'s code is written in: accumulator rows per invocation `tm`, groups
/// of four rows `gm` and of four columns `gn`, whether the operands are `vec4`s, and values
/// (vec4s when aligned) of A and of B per slice in all (`na`, `nb`) and per invocation
/// (`ra`, `rb`).
#[derive(Clone, Copy)]
struct Geometry {
    tm: u32,
    gm: u32,
    gn: u32,
    aligned: bool,
    na: u32,
    nb: u32,
    ra: u32,
    rb: u32,
}

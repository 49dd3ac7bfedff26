//! Launches of the `act` group: bias and activation, gated activations, rotary positions.

use super::{aligned16, grid, Launcher, MAX_BLOCKS, THREADS};
use crate::kernel::{BiasAct, GateActivation, GatedAct, Rope};
use crate::Result;

impl Launcher<'_> {
    pub(super) unsafe fn bias_act(&self, p: BiasAct) -> Result<()> {
        let (rows, cols, n) = (p.rows, p.cols, p.len());
        let code = p.act.code() as i32;
        let (px, pb, po, r, c) = (p.x.0, p.bias.0, p.out.0, rows as u64, cols as u64);
        let act = || self.module.act();
        // Rows of whole 16-byte chunks: a block per (two) rows, a thread per chunk,
        // biases held in registers (bias_act_rows8_k's comment has the measurement).
        if let (0, Ok(rows32), true, true) = (
            cols % 8,
            u32::try_from(rows),
            cols / 8 <= 1024,
            aligned16(&[px, pb, po]),
        ) {
            let c8 = (cols / 8) as u32;
            return self.go(
                act()?.bias_act_rows8.get(p.dtype)?,
                rows.div_ceil(2).min(MAX_BLOCKS) as u32,
                c8.div_ceil(32) * 32,
                &mut args![px, pb, po, rows32, c8, code],
            );
        }
        if let (0, Ok(n4), Ok(c4), true) = (
            cols % 4,
            u32::try_from(n / 4),
            u32::try_from(cols / 4),
            aligned16(&[px, pb, po]),
        ) {
            return self.go(
                act()?.bias_act4.get(p.dtype)?,
                grid(n / 4),
                THREADS,
                &mut args![px, pb, po, n4, c4, code],
            );
        }
        self.go(
            act()?.bias_act.get(p.dtype)?,
            grid(n),
            THREADS,
            &mut args![px, pb, po, r, c, code],
        )
    }

    pub(super) unsafe fn rope(&self, p: Rope) -> Result<()> {
        let (px, pc, ps, po) = (p.x.0, p.cos.0, p.sin.0, p.out.0);
        let (b, s, h, d) = (
            p.batch as u64,
            p.seq as u64,
            p.heads as u64,
            p.head_dim as u64,
        );
        let r = p.rotated as u64;
        self.go(
            self.module.act()?.rope.get(p.dtype)?,
            grid(p.pairs()),
            THREADS,
            &mut args![px, pc, ps, po, b, s, h, d, r],
        )
    }

    pub(super) unsafe fn gated_act(&self, p: GatedAct) -> Result<()> {
        // The gate's activation as `sp_gated_act` numbers it.
        let code: i32 = match p.act {
            GateActivation::Gelu => 0,
            GateActivation::GeluTanh => 1,
            GateActivation::Silu => 2,
        };
        let (px, po, r, c) = (p.x.0, p.out.0, p.rows as u64, p.cols as u64);
        self.go(
            self.module.act()?.gated_act.get(p.dtype)?,
            grid(p.rows * p.cols),
            THREADS,
            &mut args![px, po, r, c, code],
        )
    }
}

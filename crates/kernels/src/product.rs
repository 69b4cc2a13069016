//! The loop every weight format's product shares: activation rows in blocks, the panels of
//! the columns `out` covers, and the kernel's tiles of rows; one kernel call per (panel,
//! tile), its 16 outputs per row copied into `out`. The formats (`matrix`, `int4`) give the
//! panel and the kernel.

use std::borrow::Cow;

use crate::panel::Tile;
use crate::{BLOCK, ColumnsMut, Int8Rows, Isa, PANEL};

/// Activation rows multiplied by every panel of a call before the next rows start.
const ROW_BLOCK: usize = 64;

/// `out = x W^T` for an `n x k` matrix whose panel `p` times a tile of rows is
/// `kernel(p, tile, outputs)`. `wide` asks for the tiles' `i16` copy of the activations.
///
/// # Panics
/// When `isa` does not run here, the shapes disagree, or `out` starts at a column that is not
/// a multiple of [`PANEL`] or ends past `n` or inside a panel before `n`.
pub(crate) fn product(
    (n, k): (usize, usize),
    isa: Isa,
    wide: bool,
    x: &Int8Rows,
    mut out: ColumnsMut<'_>,
    mut kernel: impl FnMut(usize, Tile<'_>, &mut [[f32; PANEL]]),
) {
    assert!(isa.is_available(), "this CPU cannot run the {isa:?} kernel");
    let columns = out.columns();
    assert!(
        x.k() == k && out.rows() == x.rows(),
        "{} x {} activations times a {n} x {k} matrix into {} rows",
        x.rows(),
        x.k(),
        out.rows()
    );
    if columns.is_empty() {
        return;
    }
    assert!(
        columns.start.is_multiple_of(PANEL)
            && columns.end <= n
            && (columns.end.is_multiple_of(PANEL) || columns.end == n),
        "columns {columns:?} of {n} are not whole panels of {PANEL}"
    );
    let blocks = k / BLOCK;
    let tile_rows = isa.tile_rows();
    let wide = if wide {
        x.wide()
    } else {
        Cow::Borrowed(&[][..])
    };
    let mut tile = [[0.0f32; PANEL]; 8];
    // Rows in blocks, so a prefill's output rows being written stay in L2 across panels.
    for first_row in (0..x.rows()).step_by(ROW_BLOCK) {
        let end_row = x.rows().min(first_row + ROW_BLOCK);
        for panel in columns.start / PANEL..columns.end.div_ceil(PANEL) {
            let first = panel * PANEL - columns.start;
            let width = PANEL.min(n - panel * PANEL);
            let mut row = first_row;
            while row < end_row {
                let rows = tile_rows.min(end_row - row);
                let t = Tile {
                    q: &x.q[row * k..(row + rows) * k],
                    wide: wide.get(row * k..(row + rows) * k).unwrap_or_default(),
                    scales: &x.scales[row * blocks..(row + rows) * blocks],
                    bias: &x.bias[row * blocks..(row + rows) * blocks],
                };
                kernel(panel, t, &mut tile[..rows]);
                for (i, values) in tile[..rows].iter().enumerate() {
                    let out = &mut out.row_mut(row + i)[first..first + width];
                    // A whole panel as one fixed-size copy, which compiles to four vector
                    // moves; a slice of run-time length would call `memmove` for 64 bytes
                    // (2% of an 8-row decode step).
                    match <&mut [f32; PANEL]>::try_from(&mut *out) {
                        Ok(whole) => *whole = *values,
                        Err(_) => out.copy_from_slice(&values[..width]),
                    }
                }
                row += rows;
            }
        }
    }
}

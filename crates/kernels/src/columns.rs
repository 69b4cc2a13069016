//! Disjoint column ranges of one row-major output buffer, for threads that each write the
//! columns of every row they computed. Safe Rust can split a slice into contiguous pieces,
//! not into strided column bands; these two types do that split once, behind a safe API.
#![allow(unsafe_code)]

use std::marker::PhantomData;
use std::ops::Range;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Columns `start..end` of every row of a row-major `rows x stride` f32 buffer, borrowed
/// exclusively: no other `ColumnsMut` of the same buffer overlaps them.
#[derive(Debug)]
pub struct ColumnsMut<'a> {
    ptr: NonNull<f32>,
    rows: usize,
    stride: usize,
    start: usize,
    end: usize,
    _buffer: PhantomData<&'a mut [f32]>,
}

// SAFETY: a `ColumnsMut` is an exclusive borrow of the f32s in its columns (no other value
// can reach them while it lives), so moving it to another thread is like moving a `&mut [f32]`.
unsafe impl Send for ColumnsMut<'_> {}

impl<'a> ColumnsMut<'a> {
    /// All columns of `buffer`, read as rows of `stride` values.
    ///
    /// # Panics
    /// When `stride` is 0 or does not divide `buffer.len()`.
    pub fn new(buffer: &'a mut [f32], stride: usize) -> Self {
        assert!(
            stride > 0 && buffer.len().is_multiple_of(stride),
            "a buffer of {} values is not rows of {stride}",
            buffer.len()
        );
        Self {
            rows: buffer.len() / stride,
            stride,
            start: 0,
            end: stride,
            ptr: NonNull::from(buffer).cast(),
            _buffer: PhantomData,
        }
    }

    /// The rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The columns this value may write.
    pub fn columns(&self) -> Range<usize> {
        self.start..self.end
    }

    /// Columns `start..at` and `at..end`.
    ///
    /// # Panics
    /// When `at` is outside `start..=end`.
    pub fn split_at(self, at: usize) -> (Self, Self) {
        assert!(
            (self.start..=self.end).contains(&at),
            "column {at} is outside {:?}",
            self.columns()
        );
        let left = Self { end: at, ..self };
        let right = Self { start: at, ..self };
        (left, right)
    }

    /// This value's columns of row `row`.
    ///
    /// # Panics
    /// When `row >= rows()`.
    pub fn row_mut(&mut self, row: usize) -> &mut [f32] {
        assert!(row < self.rows, "row {row} of {}", self.rows);
        // SAFETY: `row < rows` and `start <= end <= stride`, so the range lies inside the
        // buffer of `rows * stride` values this value borrows; its columns belong to this
        // value alone, and `&mut self` keeps the returned slice unique among this value's.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.ptr.as_ptr().add(row * self.stride + self.start),
                self.end - self.start,
            )
        }
    }
}

/// Hands out the columns of a [`ColumnsMut`] in chunks, each at most once, to the threads
/// that share it: `while let Some(c) = chunks.next() { ... }` on every thread.
#[derive(Debug)]
pub struct ColumnChunks<'a> {
    columns: ColumnsMut<'a>,
    chunk: usize,
    count: usize,
    next: AtomicUsize,
}

// SAFETY: the only access through `&ColumnChunks` is `next`, which gives each chunk index
// (a disjoint column range) to exactly one caller (an atomic counter), so threads sharing it
// never get overlapping columns.
unsafe impl Sync for ColumnChunks<'_> {}

impl<'a> ColumnChunks<'a> {
    /// `columns` in chunks of `chunk` columns (the last may be shorter); the chunks start at
    /// `columns.start + i * chunk`.
    ///
    /// # Panics
    /// When `chunk` is 0.
    pub fn new(columns: ColumnsMut<'a>, chunk: usize) -> Self {
        assert!(chunk > 0, "chunks of 0 columns");
        let count = (columns.end - columns.start).div_ceil(chunk);
        Self {
            columns,
            chunk,
            count,
            next: AtomicUsize::new(0),
        }
    }

    /// How many chunks there are.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether there are no columns.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The next chunk no caller has had yet, or `None` when all have been handed out.
    #[allow(clippy::should_implement_trait)] // takes `&self`, shared by threads
    pub fn next(&self) -> Option<ColumnsMut<'_>> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        if i >= self.count {
            return None;
        }
        let start = self.columns.start + i * self.chunk;
        let end = (start + self.chunk).min(self.columns.end);
        Some(ColumnsMut {
            ptr: self.columns.ptr,
            rows: self.columns.rows,
            stride: self.columns.stride,
            start,
            end,
            _buffer: PhantomData,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_every_column_once_across_threads() {
        let (rows, stride) = (3, 37);
        let mut buffer = vec![0.0f32; rows * stride];
        {
            let (_, right) = ColumnsMut::new(&mut buffer, stride).split_at(5);
            let chunks = ColumnChunks::new(right, 4);
            assert_eq!(chunks.len(), 8);
            std::thread::scope(|s| {
                for _ in 0..3 {
                    s.spawn(|| {
                        while let Some(mut c) = chunks.next() {
                            for r in 0..c.rows() {
                                for v in c.row_mut(r) {
                                    *v += 1.0;
                                }
                            }
                        }
                    });
                }
            });
        }
        for (i, v) in buffer.iter().enumerate() {
            assert_eq!(*v, if i % stride < 5 { 0.0 } else { 1.0 }, "index {i}");
        }
    }

    #[test]
    #[should_panic(expected = "outside")]
    fn split_outside_the_columns_panics() {
        let mut buffer = vec![0.0f32; 8];
        let (left, _) = ColumnsMut::new(&mut buffer, 4).split_at(2);
        let _ = left.split_at(3);
    }
}

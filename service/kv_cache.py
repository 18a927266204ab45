"""The decoder's per-row state in preallocated numpy buffers, laid out as the step graph reads them.

Self-attention: each row's earlier steps, left-aligned (slot t holds the row's step t), appended in
place every step. Cross-attention: each row's source keys/values from the encoder, written once
when the row joins. Rows are sentences or beams; the cache knows nothing of requests or searches.
"""

from __future__ import annotations

import numpy as np

MIN_CAPACITY = 16


class DecoderCache:
    def __init__(self, n_layers: int, n_heads: int, head_dim: int) -> None:
        self.n_layers, self.n_heads, self.head_dim = n_layers, n_heads, head_dim
        self.self_keys = np.zeros((n_layers, 0, n_heads, head_dim, MIN_CAPACITY), np.float32)  # (L, B, H, Dh, T)
        self.self_values = np.zeros((n_layers, 0, n_heads, MIN_CAPACITY, head_dim), np.float32)  # (L, B, H, T, Dh)
        self.self_mask = np.zeros((0, MIN_CAPACITY), np.bool_)  # (B, T)
        self.lengths = np.zeros(0, np.int64)  # (B,) steps cached per row = the position of its next token
        self.cross_keys = np.zeros((n_layers, 0, n_heads, head_dim, 1), np.float32)  # (L, B, H, Dh, S)
        self.cross_values = np.zeros((n_layers, 0, n_heads, 1, head_dim), np.float32)  # (L, B, H, S, Dh)
        self.src_mask = np.zeros((0, 1), np.bool_)  # (B, S)

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def capacity(self) -> int:
        return self.self_mask.shape[1]

    def add(self, cross_keys: np.ndarray, cross_values: np.ndarray, src_mask: np.ndarray) -> None:
        """New rows with no steps yet: cross_keys (L, b, H, Dh, S'), cross_values (L, b, H, S', Dh)."""
        width = max(self.src_mask.shape[1], src_mask.shape[1])
        old = _pad_source(self.cross_keys, self.cross_values, self.src_mask, width)
        new = _pad_source(cross_keys, cross_values, src_mask, width)
        self.cross_keys = np.concatenate([old[0], new[0]], axis=1)  # (L, B+b, H, Dh, S)
        self.cross_values = np.concatenate([old[1], new[1]], axis=1)  # (L, B+b, H, S, Dh)
        self.src_mask = np.concatenate([old[2], new[2]], axis=0)  # (B+b, S)
        b = src_mask.shape[0]
        self.self_keys = np.concatenate([self.self_keys, self._zeros_like_rows(self.self_keys, b)], axis=1)
        self.self_values = np.concatenate([self.self_values, self._zeros_like_rows(self.self_values, b)], axis=1)
        self.self_mask = np.concatenate([self.self_mask, np.zeros((b, self.capacity), np.bool_)], axis=0)
        self.lengths = np.concatenate([self.lengths, np.zeros(b, np.int64)])

    @staticmethod
    def _zeros_like_rows(buffer: np.ndarray, rows: int) -> np.ndarray:
        shape = list(buffer.shape)
        shape[1] = rows
        return np.zeros(shape, buffer.dtype)

    def select(self, rows: np.ndarray) -> None:
        """Keep, repeat or reorder rows (beams following their parents, finished rows leaving)."""
        if len(rows) == self.rows and np.array_equal(rows, np.arange(self.rows)):
            return
        self.self_keys = self.self_keys[:, rows]  # (L, B', H, Dh, T)
        self.self_values = self.self_values[:, rows]  # (L, B', H, T, Dh)
        self.self_mask = self.self_mask[rows]  # (B', T)
        self.lengths = self.lengths[rows]  # (B',)
        self.cross_keys = self.cross_keys[:, rows]  # (L, B', H, Dh, S)
        self.cross_values = self.cross_values[:, rows]  # (L, B', H, S, Dh)
        self.src_mask = self.src_mask[rows]  # (B', S)

    def append(self, step_keys: np.ndarray, step_values: np.ndarray) -> None:
        """Write this step's keys/values (L, B, H, Dh) at each row's next slot, in place."""
        if self.rows and self.lengths.max() >= self.capacity:
            self._grow(max(2 * self.capacity, int(self.lengths.max()) + 1))
        rows = np.arange(self.rows)
        self.self_keys[:, rows, :, :, self.lengths] = step_keys.transpose(1, 0, 2, 3)  # (B, L, H, Dh)
        self.self_values[:, rows, :, self.lengths, :] = step_values.transpose(1, 0, 2, 3)  # (B, L, H, Dh)
        self.self_mask[rows, self.lengths] = True
        self.lengths += 1

    def _grow(self, capacity: int) -> None:
        extra = capacity - self.capacity
        self.self_keys = np.pad(self.self_keys, [(0, 0)] * 4 + [(0, extra)])  # (L, B, H, Dh, T')
        self.self_values = np.pad(self.self_values, [(0, 0)] * 3 + [(0, extra), (0, 0)])  # (L, B, H, T', Dh)
        self.self_mask = np.pad(self.self_mask, [(0, 0), (0, extra)])  # (B, T')


def _pad_source(
    keys: np.ndarray, values: np.ndarray, mask: np.ndarray, width: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Right-pad the source axis to `width` (padding is masked out)."""
    extra = width - mask.shape[1]
    if extra == 0:
        return keys, values, mask
    keys = np.pad(keys, [(0, 0)] * 4 + [(0, extra)])  # (L, B, H, Dh, S)
    values = np.pad(values, [(0, 0)] * 3 + [(0, extra), (0, 0)])  # (L, B, H, S, Dh)
    return keys, values, np.pad(mask, [(0, 0), (0, extra)])  # (B, S)

"""The decoder's per-row state in preallocated numpy buffers, laid out as the step graph reads them.

Self-attention: each row's earlier steps, left-aligned (slot t holds the row's step t); the step graph writes
each row's new step at slot `lengths[row]` itself, into these buffers (format 3), and the cache then counts it
(`advance`). Cross-attention: each sentence's source keys/values from the encoder, written once
when it joins and shared by all of its rows (beams): `sentence` maps each row to its sentence, and the
step graph attends with every sentence's rows grouped (`sentence_rows`, `row_slots`). So beam search
holds one copy of a source per sentence, not one per beam, and reads it once per step for all its
beams. Rows are sentences or beams; the cache knows nothing of requests or searches.
The buffers are the graphs' cache dtype (float32, or float16 for the fp16 variant), numpy arrays in host memory
or, for a float16 graph on CUDA, CuPy arrays in GPU memory (the same array API: `xp`).
Each layer's keys and values are an array of their own, (B, H, time, Dh): an append writes contiguous
Dh vectors, and a buffer that grows or shrinks does so one layer at a time, so that the old and the new
buffer are never both whole in memory (on the paper-size model at beam 4 x 32 that transient set the peak).
In GPU memory the layers are instead views of one (L, R, H, time, Dh) array per buffer (`stacked`): each is
still contiguous, and a reorder moves every layer's rows in one gather and one scatter, where a CuPy operation
per layer cost ~30 us of host time before the GPU did anything (beam 4 x 32 of the paper-size model on an H200:
24 such operations a step). A stacked buffer is resized whole (the old and the new both in GPU memory for that
moment).

A host cache also records each row's input token at each slot it wrote (`advance`). Rows of one sentence whose
tokens agree up to a slot hold the same keys and values up to it, bit for bit: a prefix is computed once, in the
row of the one beam that has it, and reaches other rows only by copies. So a beam that takes a sibling's row copies
only the slots after their common prefix (`_shared`; the default model at beam 4: a fifth to two fifths of the
slots whole rows would copy).

The four big buffers have room for more rows (sentences) than are live (like a growing list), so that rows
join, leave and follow their parents in place: a continuous batch that a sentence joins at every step never
copies the whole cache. The step graph gets each layer's first B rows (N sentences), a contiguous view. When
sentences leave, the last live sentences' sources move into their places, so that the live ones stay first; for
greedy rows, sentences joining at that moment take those places first (`refill`).

Cross-attention reads every source position of its buffers at every step (self-attention reads only each
row's written slots), so the source axis gives back room when the sentences that needed it leave, and the time
axis gives back memory: a server whose one long sentence has finished must not attend over its 80 source
positions for every short sentence after it.

Host self-attention buffers can instead be `reserve`d: their time axis as long as any row can ever grow (the model's
positions), as address space whose pages the kernel supplies when a row first writes them (4 KB pages, no
transparent huge pages), so that the time axis never grows: no row's steps are copied into a longer buffer, nor its
fresh pages faulted all at once (a server at 32 clients of the paper-size model spent 4 % of its decoding threads'
time in those regrowths). Each row holds the pages of the slots it and the rows before it in its place wrote; when
a quarter of what the rows wrote would hold the longest live row, the pages past it go back to the kernel
(`release`), where a growing buffer would have shrunk. A reserved buffer of a few rows (under LAZY_BYTES) is the
allocator's memory instead, at the same length: reused from sentence to sentence, it costs no mapping per sentence.
Where the kernel refuses that address space (a process limit such as `ulimit -v`, or `vm.overcommit_memory=2`, which
counts every reserved page), the cache grows its time axis instead, as on a GPU, and so does every cache the process
makes after it (`grow_instead`).
"""

from __future__ import annotations

import logging
import math
import mmap
from types import ModuleType
from typing import Any

import numpy as np

ArrayModule = ModuleType  # numpy, or cupy: the same array API over host or GPU memory
MIN_CAPACITY = 16  # time slots
TIME_AXIS = 2  # of each layer's (R, H, T, Dh) buffer
BUFFERS = ("self_keys", "self_values", "cross_keys", "cross_values")
SLICED_ROWS = 4  # moved rows copied one slice each, when none is also read (see DecoderCache._copy_rows)
FEW_ROWS = 16  # selections of up to this many rows done on Python lists when they only reorder beams (select)
SHARE_BYTES = 384 << 10  # a reorder of beams that would copy this much self-attention first looks for shared slots
LAZY_BYTES = 4 << 20  # a reserved buffer from this size up is address space (lazy_zeros), where numpy's are huge pages

log = logging.getLogger(__name__)
_refused: list[OSError] = []  # the kernel's refusal of a reserved buffer, once: the process's caches grow after it


def _live(name: str, count: str) -> property:
    """The live rows (or sentences) of one of the four buffers: per layer, a contiguous (B or N, ...) view."""
    return property(lambda cache: [layer[: getattr(cache, count)] for layer in cache._store[name]])


class DecoderCache:
    def __init__(
        self,
        n_layers: int,
        n_heads: int,
        head_dim: int,
        dtype: str = "float32",
        xp: ArrayModule = np,
        bound_copies: bool = False,
        reserve: int | None = None,
        dense: bool = False,
        stacked: bool | None = None,
    ) -> None:
        """`dtype`: the graphs' cache dtype (float16 for the fp16 variant); `xp`: the module the four buffers live
        in, numpy (host memory) or CuPy (GPU memory, for a step graph that runs on CUDA). The small per-row index
        arrays are numpy either way: the runtime binds them as host inputs. `bound_copies`: a runtime's binding
        holds copies of the host arrays, made when they were bound (ONNX Runtime on CUDA), so that an array changed
        in place (a newcomer written into a finished row's place) drops it too. `reserve`: host self-attention
        buffers of that many time slots, as address space (see the module's docstring); None: grown as rows need.
        `dense`: for a step graph whose self-attention reads every slot of the time axis, masking those past each
        row's own (format 10's dense step graph): the axis grows as rows need, and every slot a row has not written
        reads as zeros or as what an earlier row wrote there, never as uninitialised memory (whose NaNs a masked
        score would still carry into the softmax). `stacked`: each buffer's layers as views of one array (see the
        module's docstring); None: in GPU memory only. A stacked cache reserves nothing."""
        self.n_layers, self.n_heads, self.head_dim, self.xp = n_layers, n_heads, head_dim, xp
        self.bound_copies = bound_copies
        self.dense = dense
        self.stacked = xp is not np if stacked is None else stacked
        self.reserved = reserve is not None and xp is np and not _refused and not dense and not self.stacked
        self._written = 0  # slots the rows have written since the last release (reserved buffers)
        time = reserve if self.reserved else MIN_CAPACITY
        self._store: dict[str, list[Any]] = {}  # per layer (R, H, T, Dh) for rows, (R', H, S, Dh) for sentences
        self._stacks: dict[str, Any] = {}  # (L, R, H, T, Dh) or (L, R', H, S, Dh), whose layers _store views
        for name in BUFFERS:
            shape = (0, n_heads, time if name.startswith("self") else 1, head_dim)  # past the live rows: free room
            if self.stacked:
                self._set_stack(name, xp.zeros((n_layers, *shape), dtype))
            else:
                self._store[name] = [xp.zeros(shape, dtype) for _ in range(n_layers)]
        self.lengths = np.zeros(0, np.int64)  # (B,) steps cached per row = the position of its next token
        self.sentence = np.zeros(0, np.int64)  # (B,) each row's sentence: its index in the cross buffers
        self.src_mask = np.zeros((0, 1), np.bool_)  # (N, S) per sentence
        self.candidates = np.zeros((0, 0), np.int64)  # (N, C) per sentence: its shortlist's candidates (or C = 0)
        self._groups: tuple[np.ndarray, np.ndarray] | None = None  # sentence_rows, row_slots of these rows
        self._in_order = True  # row i is sentence i's one row (greedy rows; any search's first step): see refill
        self._vacant = np.zeros(0, np.int64)  # places refill left for joining sentences, which `add` fills first
        self.bound: Any = None  # a runtime's binding of the arrays a step is given (engine/runtime.py); see _changed
        # (R, T) each host row's input token at each slot it wrote (`advance`), to find what beams share (`_shared`);
        # None in GPU memory, or once a step's tokens were not given
        self._tokens: np.ndarray | None = np.zeros((0, 0), np.int64) if xp is np else None
        self._slot_bytes = 2 * n_layers * n_heads * head_dim * np.dtype(dtype).itemsize  # a row's slot, every layer
        self.most_steps: int | None = None  # the most steps any live row's search may take: the time axis's ceiling

    def _set_stack(self, name: str, stack: Any) -> None:
        """A stacked buffer (L, R, H, T, Dh) and its layers' views."""
        self._stacks[name] = stack
        self._store[name] = list(stack)  # L x (R, H, T, Dh) contiguous views

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def sentences(self) -> int:
        return self.src_mask.shape[0]

    @property
    def on_gpu(self) -> bool:
        return self.xp is not np

    @property
    def capacity(self) -> int:
        """Time slots per row."""
        return self._store["self_keys"][0].shape[TIME_AXIS]

    self_keys = _live("self_keys", "rows")  # L x (B, H, T, Dh)
    self_values = _live("self_values", "rows")  # L x (B, H, T, Dh)
    cross_keys = _live("cross_keys", "sentences")  # L x (N, H, S, Dh)
    cross_values = _live("cross_values", "sentences")  # L x (N, H, S, Dh)

    @property
    def sentence_rows(self) -> np.ndarray:
        """(N, G) each sentence's rows, padded by repeating its first (see `group_rows`)."""
        return self._grouped()[0]

    @property
    def row_slots(self) -> np.ndarray:
        """(B,) each row's place in the flattened (N x G) `sentence_rows`."""
        return self._grouped()[1]

    def _grouped(self) -> tuple[np.ndarray, np.ndarray]:
        if self._groups is None:
            self._groups = group_rows(self.sentence, self.sentences)
        return self._groups

    def add(
        self, cross_keys: np.ndarray, cross_values: np.ndarray, src_mask: np.ndarray, owned: bool = False,
        candidates: np.ndarray | None = None,
    ) -> np.ndarray:
        """New sentences with one row each and no steps yet: cross_keys and cross_values (L, b, H, S', Dh),
        src_mask (b, S'). They take the places `refill` left for them first, then join at the end. Returns the
        rows they took (b,). Into left places, and no wider than the live sources, they are written in place: the
        arrays a step is given stay the same (lengths and src_mask changed in place), and so does its binding.
        `owned`: the caller hands the arrays over and reads or writes them no more (an encoder pass's memory): into a
        cache without sentences nor room for them, host arrays of its dtype whose layers are contiguous are then
        taken as its buffers, not copied into new ones (`adopts`: a static batch's). `candidates` (b, C): each new
        sentence's shortlist candidates, which move with its source (C = 0 without a shortlist)."""
        adopted = owned and src_mask.shape[1] >= self.src_mask.shape[1] and self.adopts(cross_keys, cross_values)
        b, width, first = src_mask.shape[0], max(self.src_mask.shape[1], src_mask.shape[1]), self.sentences
        places, self._vacant = self._vacant[:b], self._vacant[b:]  # (v,) left for them, (the rest) for later ones
        appended = b - places.size
        if appended or width > self.src_mask.shape[1]:  # (a binding of copies was dropped by refill already)
            self._changed()
            self._reserve(self.rows + appended, 0 if adopted else first + appended, 1 if adopted else width)
        rows = np.concatenate([places, np.arange(first, first + appended)])  # (b,)
        sliced = not self.on_gpu and b <= SLICED_ROWS  # a few rows: a slice copy each (see _copy_rows)
        targets = rows.tolist() if sliced else self.xp.asarray(rows)
        for name, new in (("cross_keys", cross_keys), ("cross_values", cross_values)):
            if adopted:
                self._store[name] = list(new)  # L x (b, H, S', Dh): every position its own, nothing to zero
                continue
            for layer, new_layer in zip(self._store[name], self.xp.asarray(new), strict=True):  # (R', H, S, Dh)
                span = new_layer.shape[TIME_AXIS]  # S'; the rest of the source axis is masked
                if not places.size:  # rows at the end: one contiguous block
                    layer[first : first + b, :, :span] = new_layer  # (b, H, S', Dh)
                elif sliced:
                    for row, new_row in zip(targets, new_layer, strict=True):
                        layer[row, :, :span] = new_row  # (H, S', Dh)
                else:
                    layer[targets, :, :span] = new_layer  # (b, H, S', Dh)
        mask = widen_mask(src_mask, width)  # (b, S); the rest of each source's positions masked
        self.src_mask = widen_mask(self.src_mask, width)  # (N, S) itself when no wider
        self.src_mask[places] = mask[: places.size]
        self.lengths[places] = 0
        if candidates is not None and candidates.shape[1] != self.candidates.shape[1]:
            self.candidates = np.zeros((first, candidates.shape[1]), np.int64)  # (N, C): the runtime's first
        new = np.zeros((b, self.candidates.shape[1]), np.int64) if candidates is None else candidates  # (b, C)
        self.candidates[places] = new[: places.size]
        if appended:
            self.candidates = np.concatenate([self.candidates, new[places.size :]], axis=0)  # (N + a, C)
            self.src_mask = np.concatenate([self.src_mask, mask[places.size :]], axis=0)  # (N + a, S)
            self.lengths = np.concatenate([self.lengths, np.zeros(appended, np.int64)])  # (B + a,)
            self.sentence = np.concatenate([self.sentence, np.arange(first, first + appended)])  # (B + a,)
            self._groups = None
        if places.size and not self._vacant.size:
            self._shrink()  # what refill left until its places were filled
        return rows

    def adopts(self, cross_keys: Any, cross_values: Any) -> bool:
        """Whether `add` takes these (L, b, H, S', Dh) arrays' layers as the cross buffers themselves: a cache
        without sentences (nor rows, nor places left) whose buffers have fewer than b rows (they would be made
        anew: a fresh cache; a server's, which keeps its room, copies into it), in host memory, and arrays of its
        dtype, writable, whose layers are C-contiguous (a slice of a wider source axis is not: it is copied); not into
        a stacked cache, whose layers are views of its own arrays."""
        room = self._store["cross_keys"][0]  # (R', H, S, Dh)
        if self.sentences or self.rows or self._vacant.size or self.stacked or room.shape[0] >= len(cross_keys[0]):
            return False
        return all(
            isinstance(new, np.ndarray) and new.dtype == room.dtype and new.flags.writeable
            and new[0].flags.c_contiguous
            for new in (cross_keys, cross_values)
        )

    def refill(self, rows: np.ndarray, room: int) -> np.ndarray:
        """`select` for rows that are each their own sentence, in order (greedy rows: `in_order`), keeping the
        distinct rows `rows` and leaving `room` places for sentences about to join, which `add` fills: finished
        rows' places first, so that a newcomer takes a finished row's place where otherwise a row from the end
        would have moved there (its steps and its source copied). When as many join as finished, nothing moves
        and the arrays a step is given stay the same: the next step keeps its binding. Returns each place's row
        before (-1: left for a newcomer). Every place must be filled before the next step (make_room checks)."""
        if not self.rows or not self._in_order or self._vacant.size:  # it follows a step: there are rows
            raise ValueError("refill needs rows that are each their own sentence, in order, and no places left open")
        count = len(rows) + room
        alive = np.zeros(max(self.rows, count), np.bool_)  # (max(B, B'),)
        alive[rows] = True
        if np.count_nonzero(alive) != len(rows):
            raise ValueError("refill keeps each row at most once")
        dead = np.flatnonzero(~alive[:count])  # places below the new count that no kept row holds
        tail = np.flatnonzero(alive[count:]) + count  # kept rows past it: they move into the first such places
        moved, vacant = dead[: tail.size], dead[tail.size :]
        layout = np.arange(count)  # (B',)
        layout[moved] = tail
        layout[vacant] = -1
        self._relayout(layout, moved, tail, vacant)
        return layout

    @property
    def in_order(self) -> bool:
        """Row i is sentence i's one row (greedy rows; a search's first step), and no place is left open."""
        return self._in_order and not self._vacant.size

    def select(self, rows: np.ndarray | None) -> None:
        """Keep, repeat or reorder rows (beams following their parents, finished rows leaving), in place. A row
        takes its parent's sentence: no source moves, except those of sentences that must fill the places of
        sentences no row attends to any more. None: every row stays (advance_all's greedy rows, none finished)."""
        if rows is None:
            return
        n = len(rows)
        if n == self.rows and n <= FEW_ROWS and not self.on_gpu and self._follow_parents(rows.tolist()):
            return
        moved = np.flatnonzero(rows != np.arange(n))  # (m,) rows that take another row's state
        if n == self.rows and not moved.size:
            return  # every row keeps its own state (greedy rows, none finished): nothing moves, the groups hold
        parents = rows[moved]  # (m,)
        if self._vacant.size:
            raise RuntimeError("a selection before the places left for joining sentences were filled")
        if self._in_order and n <= self.rows and (parents >= n).all() and len(set(parents.tolist())) == moved.size:
            self._relayout(rows, moved, parents, moved[:0])  # finished rows' places taken by rows from past the end
            return
        if n > self.rows:
            self._reserve(n, self.sentences, self.src_mask.shape[1])
        filled = int(self.lengths[parents].max(initial=0))  # the most slots a copied row has written
        self._copy_rows(("self_keys", "self_values"), moved, parents, filled)
        if n == self.rows and (self.sentence[parents] == self.sentence[moved]).all():
            return  # beams changing parents within their sentences, whose rows all have the sentence's length:
            # lengths, sentences and groups hold, and nothing can shrink
        lengths, sentence = self.lengths[rows], self.sentence[rows]  # (B',) each
        self._changed()
        self.lengths, self.sentence = lengths, sentence
        self._drop_sentences()
        self._groups = None
        self._in_order = self.rows == self.sentences  # one row each ...
        if self._in_order:
            self._put_in_order()  # ... and row i sentence i's
        self._shrink()

    def _follow_parents(self, rows: list[int]) -> bool:
        """`select` of as many rows as there are, each from its own sentence (beams changing parents within their
        sentences: a beam search's every step), on Python lists: a few rows' bookkeeping in numpy cost a call of ~1
        us each, ~8 of them, which this skips (one sentence's beam-4 selection in the decoding loop: 31-34 -> 23
        us). Returns False, having done nothing, for any other selection (rows that change sentence, a row both
        read and written, places left open): the general path's."""
        moved = [row for row, parent in enumerate(rows) if parent != row]
        if not moved:
            return True  # every row keeps its own state: nothing moves, the groups hold
        sentence = self.sentence.tolist()
        if self._vacant.size or any(sentence[rows[row]] != sentence[row] for row in moved):
            return False
        parents = [rows[row] for row in moved]
        if not set(moved).isdisjoint(parents):  # a row both read and written: the general path's copies
            return False
        lengths = self.lengths.tolist()
        filled = max(lengths[parent] for parent in parents)  # the most slots a copied row has written
        firsts = None
        if self._tokens is not None:  # `_carry_tokens` on lists (one beam's select 22 against 27 us in numpy)
            self._token_room(self.rows, filled)
            if len(moved) * filled * self._slot_bytes >= SHARE_BYTES:
                firsts = self._shared(np.array(moved), np.array(parents), filled)  # (m,) or None
            for target, parent in zip(moved, parents, strict=True):  # no row is both: one slice copy each
                self._tokens[target, :filled] = self._tokens[parent, :filled]  # (filled,)
        for name in ("self_keys", "self_values"):
            self._copy_slices(name, moved, parents, filled, None if firsts is None else firsts.tolist())
        return True

    def _put_in_order(self) -> None:
        """Rows that are each their own sentence but not in order (the last beams left): each source moves to its
        row's place, once, so that the greedy paths (refill, _relayout) apply from here on."""
        moved = np.flatnonzero(self.sentence != np.arange(self.rows))  # (m,) rows whose sentence is elsewhere
        if not moved.size:
            return
        parents = self.sentence[moved]  # (m,) where their sources are: a permutation of the same places
        self._copy_rows(("cross_keys", "cross_values"), moved, parents, self.src_mask.shape[1])  # reads all first
        self.src_mask = self.src_mask[self.sentence]  # (N, S) row i's
        self.candidates = self.candidates[self.sentence]  # (N, C) row i's
        self.sentence = np.arange(self.rows)  # (B,)

    def _relayout(self, layout: np.ndarray, moved: np.ndarray, parents: np.ndarray, vacant: np.ndarray) -> None:
        """Rows that are each their own sentence, in order, and stay so, to `layout` (B',): each place's row before,
        or -1 for a place left open for a joining sentence (`add`): places `moved` take rows `parents` (each from
        past the new count), places `vacant` are left open. A moved row's sentence (its source and mask) moves with
        it, to the same place. What a continuous batch of greedy rows does at nearly every step, in a third of the
        general path's array operations: no sentence map to gather, rename or search for sentences no row attends
        to. At the same row count nothing moves (no row is past it) and the arrays a step is given change in place:
        its binding holds."""
        count, before = len(layout), self.rows
        if count != before or self.bound_copies:
            self._changed()
        if count > before:
            self._reserve(count, count, self.src_mask.shape[1])
        if moved.size:
            filled = int(self.lengths[parents].max())  # the most slots a copied row has written
            self._copy_rows(("self_keys", "self_values"), moved, parents, filled)
            used = np.flatnonzero(self.src_mask[parents].any(axis=0))  # (S',) source positions the movers have
            self._copy_rows(("cross_keys", "cross_values"), moved, parents, int(used[-1]) + 1 if used.size else 0)
        if count == before:  # open places only, in place
            self.lengths[vacant] = 0
        else:  # open places (-1) read the last row, then are cleared: no steps, no source until add
            lengths, src_mask = self.lengths[layout], self.src_mask[layout]  # (B',), (N', S)
            lengths[vacant], src_mask[vacant] = 0, False
            self.lengths, self.src_mask, self.sentence = lengths, src_mask, np.arange(count)
            self.candidates = self.candidates[layout]  # (N', C); an open place's until add fills it
            self._groups = None
        self._vacant = vacant
        if not vacant.size:
            self._shrink()  # else once add has filled them

    def _drop_sentences(self) -> None:
        """Sentences that no row attends to leave; the last live ones move into their places (one copy of each
        mover's source, once), so that the N live sentences stay the buffers' first N."""
        live = np.zeros(self.sentences, np.bool_)  # (N,)
        live[self.sentence] = True
        kept = int(live.sum())
        if kept == self.sentences:
            return
        movers = np.flatnonzero(live[kept:]) + kept  # (m,) live sentences past the new end
        holes = np.flatnonzero(~live[:kept])  # (m,) the places they take
        used = np.flatnonzero(self.src_mask[movers].any(axis=0))  # (S',) source positions the movers have
        self._copy_rows(("cross_keys", "cross_values"), holes, movers, int(used[-1]) + 1 if used.size else 0)
        self.src_mask[holes] = self.src_mask[movers]  # (m, S)
        self.src_mask = self.src_mask[:kept]  # (N', S) contiguous: the first rows of a C-order array
        self.candidates[holes] = self.candidates[movers]  # (m, C)
        self.candidates = self.candidates[:kept]  # (N', C)
        renamed = np.arange(len(live))  # (N,)
        renamed[movers] = holes
        self.sentence = renamed[self.sentence]  # (B,)

    def _copy_rows(self, names: tuple[str, ...], targets: np.ndarray, parents: np.ndarray, width: int) -> None:
        """In each buffer of `names`, rows `targets` take rows `parents`' first `width` time slots (a beam that
        continues its own row, the common case, costs nothing). Up to SLICED_ROWS rows of which none is both read
        and written (always, for beams that keep their count: a parent keeps its own row; and for the rows that
        fill finished ones: they come from past the new count) are each one slice copy, no temporary: numpy's fancy
        indexing costs ~4 us per call before it moves a byte (one row of the default model's 6 buffers: 9 against
        25 us). More rows, or rows read and written, or buffers on the GPU (a kernel per slice): one fancy-indexed
        copy per layer, whose right side is a temporary of one layer's moved rows, so that every parent is read
        before any row is written; past a few rows of a few slots it is the faster (16 rows of 2 slots: 44 against
        91 us), and it beats np.take on this strided slice (3.5 vs 6.3 ms per buffer at 128 rows, 20 of 32 slots).
        Stacked buffers: one such copy per buffer, every layer at once; the indexes go to the GPU once for all.
        Self-attention rows of a host cache copy only the slots their parents' hold that they do not (`_shared`),
        the rows in up to two groups by where that begins (`start_groups`), each group's parents read before any
        row is written."""
        if not targets.size or not width:
            return
        starts = self._carry_tokens(targets, parents, width) if names[0].startswith("self") else None
        if not self.on_gpu and targets.size <= SLICED_ROWS:
            rows, sources = targets.tolist(), parents.tolist()
            if set(rows).isdisjoint(sources):
                firsts = [0] * len(rows) if starts is None else starts.tolist()
                for name in names:
                    self._copy_slices(name, rows, sources, width, firsts)
                return
        if self.on_gpu:
            targets, parents = self.xp.asarray(np.stack([targets, parents]))  # (m,) each, in GPU memory: one copy
        groups = [(targets, parents, 0)] if starts is None else start_groups(targets, parents, starts, width)
        for name in names:
            if self.stacked:
                stack = self._stacks[name]  # (L, R, H, T, Dh)
                stack[:, targets, :, :width] = stack[:, parents, :, :width]  # (L, m, H, width, Dh)
                continue
            for layer in self._store[name]:  # (R, H, T, Dh)
                moving = [layer[p, :, first:width] for _, p, first in groups]  # (m', H, width - first, Dh) each
                for (t, _, first), rows_moving in zip(groups, moving, strict=True):
                    layer[t, :, first:width] = rows_moving

    def _copy_slices(
        self, name: str, targets: list[int], parents: list[int], width: int, firsts: list[int] | None = None
    ) -> None:
        """`_copy_rows` one slice copy a row and layer, no temporary: for host buffers and rows of which none is
        both read and written (the caller has checked). `firsts`: each row's first slot to copy (0: all)."""
        firsts = firsts or [0] * len(targets)
        for layer in self._store[name]:  # (R, H, T, Dh)
            for target, parent, first in zip(targets, parents, firsts, strict=True):
                if first < width:
                    layer[target, :, first:width] = layer[parent, :, first:width]  # (H, width - first, Dh)

    def make_room(self) -> int:
        """A free slot for every row's next step: the step graph writes it at slot `lengths[row]`. Returns the
        longest row's cached steps (0 without rows), which the step's attention lengths need too."""
        if self._vacant.size:  # an open place's all-False mask would give its row NaNs, which int8's scales spread
            raise RuntimeError(f"{self._vacant.size} places left for joining sentences were not filled")
        longest = int(self.lengths.max()) if self.rows else 0
        if longest >= self.capacity:
            self._resize_time(("self_keys", "self_values"), fitted_capacity(longest + 1, self.most_steps))
        self._written = max(self._written, longest + 1)
        if self._tokens is not None:
            self._token_room(self.rows, longest + 1)  # the step's tokens, recorded by `advance`
        return longest

    def advance(self, tokens: np.ndarray | None = None) -> None:
        """Every row's step has been written (by the step graph, at slot `lengths[row]`): count it, in place (a
        runtime may have bound `lengths` itself). `tokens` (B,): the step's input ids, which a host cache records at
        each row's slot (see `_shared`); a step without them ends that record, and with it the sharing."""
        if self._tokens is not None and tokens is None:
            self._tokens = None
        elif self._tokens is not None:
            self._tokens[np.arange(self.rows), self.lengths] = tokens  # (B,) at each row's slot (room: make_room)
        self.lengths += 1

    def _token_room(self, rows: int, slots: int) -> None:
        """The token record grown (doubling) to at least `rows` rows of `slots` slots."""
        assert self._tokens is not None
        have_rows, have_slots = self._tokens.shape
        if rows > have_rows or slots > have_slots:
            grown = np.zeros((max(rows, 2 * have_rows), max(slots, 2 * have_slots, MIN_CAPACITY)), np.int64)
            grown[:have_rows, :have_slots] = self._tokens  # (R, T)
            self._tokens = grown

    def _carry_tokens(self, targets: np.ndarray, parents: np.ndarray, width: int) -> np.ndarray | None:
        """The token record's rows follow the self-attention rows they describe. Returns `_shared`'s slots, found
        before they move, where the copy would be SHARE_BYTES or more (finding them takes ~12 us); else None."""
        if self._tokens is None:
            return None
        self._token_room(max(self.rows, int(targets.max()) + 1), width)  # (a row that joined has written nothing)
        worth = targets.size * width * self._slot_bytes >= SHARE_BYTES
        starts = self._shared(targets, parents, width) if worth else None  # (m,)
        self._tokens[targets, :width] = self._tokens[parents, :width]  # (m, width)
        return starts

    def _shared(self, targets: np.ndarray, parents: np.ndarray, width: int) -> np.ndarray | None:
        """For rows `targets` about to take rows `parents`' first `width` slots: how many leading slots each already
        holds of its parent's, bit for bit (0 for a row of another sentence, or none yet). Two rows of one sentence
        whose input tokens agree up to a slot hold the same keys and values up to it: a beam's prefix is computed
        once, in the row of the one beam that has it (two running beams never have the same tokens), and reaches
        other rows only by copies. So a beam that takes a sibling's row copies only what follows their common
        prefix (the default model at beam 4, 256 sentences: 22 % of the slots forced to 32 tokens, 39 % on real
        text). None where no target shares its parent's sentence: copy every slot. The record has room for them
        (`_carry_tokens`)."""
        assert self._tokens is not None
        rows = self.rows
        live = targets < rows  # (m,) targets that hold a row now; the others are new
        held = np.minimum(targets, max(rows - 1, 0))  # (m,)
        same = live & (self.sentence[held] == self.sentence[parents])  # (m,)
        if not same.any():  # (rows that fill finished sentences' places: nothing to look for)
            return None
        agree = self._tokens[held, :width] == self._tokens[parents, :width]  # (m, width)
        shared = np.where(agree.all(axis=1), width, agree.argmin(axis=1))  # (m,) the first slot that differs
        shared = np.minimum(shared, np.minimum(self.lengths[held], self.lengths[parents]))  # within what both wrote
        return np.where(same, shared, 0)

    def _reserve(self, rows: int, sentences: int, width: int) -> None:
        """Room for `rows` rows and `sentences` sources `width` long: a row axis at least doubles when it grows."""
        for name, store in self._store.items():
            needed = rows if name.startswith("self") else sentences
            reserved, time = store[0].shape[0], store[0].shape[TIME_AXIS]
            wanted = time if name.startswith("self") else max(time, width)
            if needed > reserved or wanted > time:
                self._resize(name, max(needed, 2 * reserved) if needed > reserved else reserved, wanted)

    def _shrink(self) -> None:
        """After rows left: the source axis (exact) shrinks to what the live sentences use whenever that at least
        halves it, and the time axis (with room to grow) when that at least quarters it. A shrink copies the live
        rows once; every step after it reads that much less source (cross-attention reads every position) and
        the cache holds that much less memory. Self-attention reads only each row's written slots, so the time
        axis's room costs memory alone, while each regrowth copies every live row: shrinking it at a half rather
        than a quarter, a server at 32 clients resized it twice as often (most of the cache's 4 % of a step's
        time). A readier shrink still (at a third) had made that server 5 % slower."""
        capacity = fitted_capacity(int(self.lengths.max(initial=0)) + 1, self.most_steps)
        if self.reserved and 4 * capacity <= self._written:
            for name in ("self_keys", "self_values"):
                for layer in self._store[name]:
                    release(layer, capacity)
            self._written = capacity
        elif not self.reserved and 4 * capacity <= self.capacity:
            self._resize_time(("self_keys", "self_values"), capacity)
        used = np.flatnonzero(self.src_mask.any(axis=0))  # (S',) source positions some live sentence has
        width = int(used[-1]) + 1 if used.size else 1
        if 2 * width <= self.src_mask.shape[1]:
            self._resize_time(("cross_keys", "cross_values"), width)
            self.src_mask = np.ascontiguousarray(self.src_mask[:, :width])  # (N, S')

    def _resize_time(self, names: tuple[str, ...], time: int) -> None:
        for name in names:
            self._resize(name, self._store[name][0].shape[0], time)

    def _resize(self, name: str, rows: int, time: int) -> None:
        """One buffer to (rows, H, time, Dh) per layer, a layer at a time: each old layer is freed as soon as
        its rows are copied."""
        store, live = self._store[name], self.rows if name.startswith("self") else self.sentences
        self._changed()
        if self.stacked:  # every layer at once (self-attention reads only written slots: those alone are copied)
            written = int(self.lengths.max(initial=0)) if name.startswith("self") else None
            zeroed = self.dense or not name.startswith("self")
            self._set_stack(name, resized(self._stacks[name], rows, time, live, self.xp, zeroed, written))
            return
        if name.startswith("self"):  # self-attention reads only written slots: those alone are copied
            written, lazy = int(self.lengths.max(initial=0)), self.reserved
            try:
                for i in range(len(store)):
                    store[i] = resized(
                        store[i], rows, time, live, self.xp, zeroed=self.dense, written=written, lazy=lazy
                    )
            except OSError as error:  # mmap's: the kernel refused the address space
                if not lazy:
                    raise
                self.grow_instead(error, name, rows)
            return
        for i in range(len(store)):  # cross-attention reads every source position
            store[i] = resized(store[i], rows, time, live, self.xp)

    def grow_instead(self, error: OSError, name: str, rows: int) -> None:
        """The kernel refused a reserved buffer's address space (`error`, while `name` was resized to `rows` rows):
        this cache's self-attention buffers, some layers of which may be reserved already, go to the room the
        longest row needs, and grow from then on; so do those of every cache the process makes after it. Logged
        once: the limit is the process's, or the machine's."""
        if not _refused:
            _refused.append(error)
            log.warning(
                "the kernel refused the decoder cache's reserved address space (%s): its self-attention buffers "
                "grow with the rows instead; a limit such as `ulimit -v` or vm.overcommit_memory=2 counts every "
                "reserved page, resident or not",
                error,
            )
        self.reserved = False
        time = fitted_capacity(int(self.lengths.max(initial=0)) + 1, self.most_steps)
        for other in ("self_keys", "self_values"):  # resized as a growing cache's are
            self._resize(other, rows if other == name else self._store[other][0].shape[0], time)

    def _changed(self) -> None:
        """The arrays a step is given (the buffers' live rows, lengths, src_mask, the groups) are about to be
        others: a runtime's binding of them is stale, and is dropped before the old buffers are replaced, so that
        it does not keep them alive (a buffer is replaced a layer at a time so that old and new are never both
        whole). Between changes, counting a step and reordering beams within their sentences happen in place."""
        self.bound = None


def group_rows(sentence: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """What the step graph's cross-attention needs to attend with each sentence's rows together, over one copy of
    its source: sentence_rows (N, G), each sentence's rows (G: the most any sentence has; a sentence with fewer
    repeats its first row, whose result no row reads) and row_slots (B,), each row's place in the flattened
    sentence_rows. Every sentence has a row (the cache drops the others), so B == N means one row each (greedy
    rows: a continuous batch regroups at nearly every step, and this is 5x quicker there)."""
    if len(sentence) == n:
        rows = np.empty(n, np.int64)  # (N,)
        rows[sentence] = np.arange(n)
        return rows.reshape(n, 1), sentence.copy()  # G = 1: each row's slot is its sentence
    counts = np.bincount(sentence, minlength=n)  # (N,)
    group = int(counts.max(initial=1))
    order = np.argsort(sentence, kind="stable")  # (B,) the rows, sentence by sentence
    first = np.cumsum(counts) - counts  # (N,) where each sentence's rows begin in `order`
    rank = np.arange(len(order)) - np.repeat(first, counts)  # (B,) rank of order's rows within their sentence
    row_slots = np.empty(len(order), np.int64)  # (B,)
    row_slots[order] = sentence[order] * group + rank
    sentence_rows = np.repeat(order[first], group)  # (N * G,) each sentence's first row everywhere
    sentence_rows[row_slots] = np.arange(len(order))
    return sentence_rows.reshape(n, group), row_slots


def resized(
    layer: Any,
    rows: int,
    time: int,
    live: int,
    xp: ArrayModule = np,
    zeroed: bool = True,
    written: int | None = None,
    lazy: bool = False,
) -> Any:
    """(R, H, T, Dh) -> (rows, H, time, Dh), or a stacked buffer's (L, R, H, T, Dh) -> (L, rows, H, time, Dh), the
    first `live` rows' first min(T, time, `written`) slots kept; zeros
    elsewhere, or (not `zeroed`) whatever the memory held: for buffers whose other slots nobody reads (self-attention
    reads each row's written slots only, tests/service/test_runtime.py), where zeroing took a third of a regrowth.
    Cross-attention weighs masked source positions by exactly zero, and zero times NaN is NaN: its buffers are
    zeroed. `lazy`: a host buffer whose pages come as they are written (`lazy_zeros`) from LAZY_BYTES up; a smaller
    one (a few rows) from the allocator, whose reused memory costs no system calls or page faults (the default model's
    one-row cache: 230 against 330 us a sentence of 12 steps). `layer`: a numpy or CuPy array (xp's)."""
    *layers, _, heads, slots, head_dim = layer.shape  # ([L,] R, H, T, Dh)
    shape = (*layers, rows, heads, time, head_dim)
    if lazy and math.prod(shape) * layer.itemsize >= LAZY_BYTES:
        out = lazy_zeros(shape, layer.dtype)  # (rows, H, time, Dh)
    else:
        out = xp.zeros(shape, layer.dtype) if zeroed else xp.empty(shape, layer.dtype)  # ([L,] rows, H, time, Dh)
    kept = min(time, slots, slots if written is None else written)
    out[..., :live, :, :kept, :] = layer[..., :live, :, :kept, :]  # ([L,] live, H, kept, Dh)
    return out


def lazy_zeros(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """A zeroed host array as address space: private anonymous memory, each 4 KB page supplied by the kernel when it
    is first written. Transparent huge pages are turned off for it: with them, a row's first write into a (row, head)
    block would make a whole 2 MB resident (numpy asks for huge pages for its arrays from 4 MB)."""
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if not size or not hasattr(mmap, "MAP_ANONYMOUS"):  # (not a POSIX system: its allocator's pages, as they come)
        return np.zeros(shape, dtype)
    memory = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        memory.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(memory, dtype).reshape(shape)


def mapping(array: np.ndarray) -> mmap.mmap | None:
    """The memory mapping `lazy_zeros` made for `array` (or an array viewing it); None for the allocator's memory."""
    base = array.base
    while base is not None and not isinstance(base, mmap.mmap):  # arrays' bases, then np.frombuffer's view
        base = base.obj if isinstance(base, memoryview) else base.base
    return base


def release(layer: np.ndarray, keep: int) -> None:
    """Give the kernel back the whole pages of each (row, head) block of a `lazy_zeros` buffer (R, H, T, Dh) past its
    first `keep` slots; they read as zeros after. One call per block: R x H calls (30 x 8 per layer, ~1 us each)."""
    memory = mapping(layer)
    if memory is None or not hasattr(mmap, "MADV_DONTNEED"):
        return  # not lazily allocated: its pages are the allocator's
    page = mmap.PAGESIZE
    block = layer.shape[TIME_AXIS] * layer.shape[3] * layer.itemsize  # bytes of one (row, head)'s slots
    first = keep * layer.shape[3] * layer.itemsize  # bytes kept of each
    for start in range(0, layer.shape[0] * layer.shape[1] * block, block):
        begin, end = -(-(start + first) // page) * page, (start + block) // page * page
        if end > begin:
            memory.madvise(mmap.MADV_DONTNEED, begin, end - begin)


def fitted_capacity(slots: int, most: int | None = None) -> int:
    """Room for `slots` time slots and a quarter as many again, in whole multiples of MIN_CAPACITY, but not past
    `most` (the most steps any row's search may take; None: no ceiling) unless `slots` is more: a growth copies the
    buffer once, and the room is memory that every row holds (self-attention reads only the written slots), which
    past the searches' ceiling no row would ever write (a growing cache, CUDA's, of the paper-size model's longest
    test sentence, capped at 398 tokens: 398 slots, not 464); for a reserved cache, the room `release` keeps."""
    room = -(-(slots + slots // 4) // MIN_CAPACITY) * MIN_CAPACITY
    return room if most is None else min(room, max(most, slots))


def start_groups(
    targets: np.ndarray, parents: np.ndarray, starts: np.ndarray, width: int
) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """Rows that copy slots `starts`..`width` of their parents', as one or two groups (targets, parents, first slot)
    each copied from its least start: two where that copies at most three quarters of the slots one would (a
    fancy-indexed copy costs ~4 us a layer before it moves a byte). Rows with nothing to copy are left out."""
    order = np.argsort(starts, kind="stable")  # (m,)
    first = starts[order]  # (m,) ascending
    keep = first < width
    order, first = order[keep], first[keep]
    m = order.size
    if not m:
        return []
    one = m * (width - int(first[0]))  # slots one group copies
    split = np.arange(1, m)  # (m - 1,) where the second group begins
    two = split * (width - int(first[0])) + (m - split) * (width - first[1:])  # (m - 1,)
    if not split.size or 4 * int(two.min()) > 3 * one:
        return [(targets[order], parents[order], int(first[0]))]
    at = int(split[two.argmin()])
    low, high = order[:at], order[at:]
    return [(targets[low], parents[low], int(first[0])), (targets[high], parents[high], int(first[at]))]


def widen_mask(mask: np.ndarray, width: int) -> np.ndarray:
    """(B, T) -> (B, width), False on the right."""
    if mask.shape[1] == width:
        return mask
    wider = np.zeros((mask.shape[0], width), np.bool_)
    wider[:, : mask.shape[1]] = mask
    return wider

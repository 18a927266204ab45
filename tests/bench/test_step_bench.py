"""bench.step profiles the runtime's own decoder step and prints each operator type's time per step."""

import re
from pathlib import Path

import pytest

from bench import step


def test_a_step_is_profiled_per_operator_for_each_rows_and_threads_column(
    model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--model", str(model_dir), "--rows", "6,2", "--threads", "2,1", "--beam", "2"]
    assert step.main(args + ["--source", "5", "--slots", "3", "--steps", "2", "--top", "4"]) == 0
    out = capsys.readouterr().out
    assert "| operator | 6 rows, 2 threads | 2 rows, 1 thread |" in out
    listed = re.findall(r"^\| (\w+) \| ([\d.]+) \((\d+)\) \| ([\d.]+) \((\d+)\) \|$", out, re.MULTILINE)
    assert len(listed) == 4  # --top
    rest = re.search(r"^\| the rest \| ([\d.]+) \| ([\d.]+) \|$", out, re.MULTILINE)
    assert rest and float(rest.group(1)) > 0  # what --top leaves out is summed, not dropped
    for _, _, nodes_a, _, nodes_b in listed:
        assert int(nodes_a) == int(nodes_b) > 0  # the same graph in both columns
    totals = re.search(r"^\| all nodes \| \*\*([\d.]+)\*\* \| \*\*([\d.]+)\*\* \|$", out, re.MULTILINE)
    walls = re.search(r"^\| wall, the runtime's step \| ([\d.]+) \| ([\d.]+) \|$", out, re.MULTILINE)
    assert re.search(r"^\| wall, unprofiled \| [\d.]+ \| [\d.]+ \|$", out, re.MULTILINE)
    assert totals and walls
    for graph, wall in zip(totals.groups(), walls.groups(), strict=True):
        assert 0 < float(graph) <= float(wall)  # the graph runs inside the runtime's step


def test_every_operator_type_is_listed_when_top_allows(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--model", str(model_dir), "--rows", "4", "--threads", "1", "--beam", "2", "--steps", "1", "--top", "99"]
    assert step.main(args) == 0
    out = capsys.readouterr().out
    listed = {op for op in re.findall(r"^\| (\w+) \| [\d.]+ \(\d+\) \|$", out, re.MULTILINE)}
    assert {"GroupQueryAttention", "FusedMatMul"} <= listed  # self- and cross-attention
    assert re.search(r"^\| the rest \| 0.00 \|$", out, re.MULTILINE)


def test_rows_must_be_whole_beams(model_dir: Path) -> None:
    with pytest.raises(SystemExit):
        step.main(["--model", str(model_dir), "--rows", "5", "--beam", "2"])


def test_one_row_is_profiled_in_the_one_row_graph(quantized: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An int8 folder's step of one row runs its one-row step graph (format 6): that is the graph profiled, named in
    its column, MatMulNBits its products where two rows take MatMulIntegerToFloat."""
    args = ["--model", str(quantized), "--variant", "int8", "--rows", "1,2", "--steps", "2", "--top", "99"]
    assert step.main(args) == 0
    out = capsys.readouterr().out
    assert "| operator | 1 rows, 1 thread, the one-row graph | 2 rows, 1 thread |" in out
    assert re.search(r"^\| MatMulNBits \| [\d.]+ \(\d+\) \| - \|$", out, re.MULTILINE)
    assert re.search(r"^\| MatMulIntegerToFloat \| - \| [\d.]+ \(\d+\) \|$", out, re.MULTILINE)


def test_beams_whose_first_step_took_the_one_row_graph_are_profiled_in_their_own(
    quantized: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A beam's first step has one row per sentence, which the one-row graph takes; the steps after it run the step
    graph, whose profile then holds one step fewer than were taken: each step's nodes are still counted whole."""
    args = ["--model", str(quantized), "--variant", "int8", "--rows", "2", "--beam", "2", "--steps", "2", "--top", "99"]
    assert step.main(args) == 0
    out = capsys.readouterr().out
    assert "| operator | 2 rows, 1 thread |" in out
    assert re.search(r"^\| MatMulIntegerToFloat \| [\d.]+ \(\d+\) \|$", out, re.MULTILINE)


def test_an_if_counts_only_its_own_time_beside_the_nodes_its_branch_ran() -> None:
    """ONNX Runtime's profile lists a branch's nodes as events of their own, inside their If's span: the If keeps
    only what is left, so that no time is counted twice (format 8's If around the log-softmax and top-K)."""

    def node(op: str, ts: int, dur: int) -> dict:
        return {"ts": ts, "dur": dur, "args": {"op_name": op}}

    events = [node("MatMul", 0, 50), node("TopK", 60, 30), node("Slice", 91, 2), node("If", 58, 40), node("Add", 99, 5)]
    assert [e["dur"] for e in step.own_times(events)] == [50, 30, 2, 8, 5]


def test_dense_profiles_the_dense_step_graph_from_its_rows(quantized: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--dense steps as a static runtime does: the dense step graph (format 10) from DENSE_STEP_ROWS rows, its
    self-attention a ScatterND into the cache and a MultiHeadAttention; fewer rows keep the step graph."""
    args = ["--model", str(quantized), "--variant", "int8", "--rows", "8,4", "--dense", "--steps", "2", "--top", "99"]
    assert step.main(args) == 0
    out = capsys.readouterr().out
    assert "| operator | 8 rows, 1 thread, the dense graph | 4 rows, 1 thread |" in out
    assert re.search(r"^\| ScatterND \| [\d.]+ \(\d+\) \| - \|$", out, re.MULTILINE)
    assert re.search(r"^\| GroupQueryAttention \| - \| [\d.]+ \(\d+\) \|$", out, re.MULTILINE)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dense"], "variant has no dense step graph (an int8 variant of format 10 has one"),
        (["--variant", "int4"], "no variant 'int4'; it has ['fp32']"),
    ],
)
def test_a_variant_the_folder_lacks_stops_it_at_once(
    model_dir: Path, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        step.main(["--model", str(model_dir), *argv])
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err

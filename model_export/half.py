"""Adds a float16 variant to a model folder, for GPUs: the fp32 graphs with every float weight, activation and
cache in float16, except the step graph's log-softmax, computed in float32 from the float16 logits (beam scores
sum these log-probs over every step); the top-K picks its tokens from the float16 logits, in the same order.

It is meant for GPUs: ONNX Runtime's CUDA GroupQueryAttention takes float16 (not float32), so only here does
self-attention run on the GPU, beside a cache in GPU memory (CuPy). On an H200 it ran 2.2x fp32's greedy throughput at
batch 32 (docs/performance.md "GPU"). The server runs it on CUDA from format 7 on, whose step graph is given
GroupQueryAttention's lengths (engine.runtime.gpu_array_module). On a CPU it runs (the tests check it), slower than
int8.

The conversion is ours, not onnxruntime.transformers' float16 converter: our graphs are small and known (every
float constant is an initializer, no float-typed Cast or ConstantOfShape), and that converter breaks graph outputs
that must stay float32.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from model_export.export import add_variant, fp32_copy
from model_export.onnx_graphs import drop_unread_initializers

FP16_MAX = float(np.finfo(np.float16).max)  # 65504: the fp32 encoder's masking constant (fp32 min) becomes -65504
FLOAT32_ROLES = {"log_probs", "top_log_probs"}  # outputs that stay float32
SOFTMAX_INPUT_CAST = "logits_float32"
LOG_SOFTMAX = "log_softmax"  # the step graph's input that turns its log-softmax on (format 8; see always_normalised)


def fp16_name(file_name: str) -> str:
    return file_name.removesuffix(".onnx") + ".fp16.onnx"


def always_normalised(graph: onnx.GraphProto) -> None:
    """The step graph's If over its `log_softmax` input (format 8) replaced by the branch that normalises, and the
    input dropped: the float16 step runs on GPUs, where the log-softmax costs little and an If's condition must be
    read in host memory. It normalises at every step, as every step graph did before format 8."""
    for index, node in enumerate(graph.node):
        if node.op_type == "If" and node.input[0] == LOG_SOFTMAX:
            branch = next(a.g for a in node.attribute if a.name == "then_branch")
            names = dict(zip([o.name for o in branch.output], node.output, strict=True))
            unfolded = []
            for inner in branch.node:
                copy = onnx.NodeProto()
                copy.CopyFrom(inner)
                copy.output[:] = [names.get(o, o) for o in inner.output]
                copy.input[:] = [names.get(i, i) for i in inner.input]
                unfolded.append(copy)
            nodes = list(graph.node)
            del graph.node[:]
            graph.node.extend(nodes[:index] + unfolded + nodes[index + 1 :])
            break
    kept = [value for value in graph.input if value.name != LOG_SOFTMAX]
    del graph.input[:]
    graph.input.extend(kept)
    drop_unread_initializers(graph)  # the constants of the branch left out


def to_half(model: onnx.ModelProto, keep_float32: set[str]) -> onnx.ModelProto:
    """float32 initializers (clipped to float16's range) and inputs/outputs become float16, except the outputs
    named in `keep_float32`; LogSoftmax then reads its input cast to float32 (the step graph always normalises:
    always_normalised)."""
    graph = model.graph
    always_normalised(graph)
    for i, tensor in enumerate(graph.initializer):
        if tensor.data_type == TensorProto.FLOAT:
            values = np.clip(numpy_helper.to_array(tensor), -FP16_MAX, FP16_MAX).astype(np.float16)
            graph.initializer[i].CopyFrom(numpy_helper.from_array(values, tensor.name))
    for value in list(graph.input) + list(graph.output):
        if value.type.tensor_type.elem_type == TensorProto.FLOAT and value.name not in keep_float32:
            value.type.tensor_type.elem_type = TensorProto.FLOAT16
    for index, node in enumerate(graph.node):
        if node.op_type == "LogSoftmax":
            cast = helper.make_node("Cast", [node.input[0]], [SOFTMAX_INPUT_CAST], to=TensorProto.FLOAT)
            node.input[0] = SOFTMAX_INPUT_CAST  # (B, V) float32 logits
            graph.node.insert(index, cast)
            break
    onnx.checker.check_model(model)
    return model


def add_fp16_variant(folder_path: Path, make_default: bool = False) -> dict:
    """Converts the fp32 graphs into *.fp16.onnx files and adds variant 'fp16' to the manifest."""
    folder, manifest, variant = fp32_copy(folder_path, "fp16", "convert")
    variant["decoder_step_ragged"] = None  # float16 runs on GPUs, where every step takes the general step graph
    for graph in ("encoder", "decoder_step"):
        spec = variant[graph]
        keep = {s["name"] for s in spec["outputs"] if s["role"] in FLOAT32_ROLES}
        name = fp16_name(spec["file"])
        onnx.save(to_half(onnx.load(folder.file(spec["file"])), keep), folder_path / name)
        spec["file"] = name
        spec["inputs"] = [tensor for tensor in spec["inputs"] if tensor["role"] != LOG_SOFTMAX]  # always_normalised
        for tensor in spec["inputs"] + spec["outputs"]:
            if tensor["dtype"] == "float32" and tensor["name"] not in keep:
                tensor["dtype"] = "float16"
    written = [variant["encoder"]["file"], variant["decoder_step"]["file"]]
    if manifest.get("shortlist"):  # a folder with a shortlist: the float16 shortlist step graph too
        from model_export.shortlist import add_variant_step, fp32_step_file  # here: shortlist_step imports to_half

        candidates, pad_id = manifest["shortlist"]["candidates"], folder.manifest.config.pad_id
        written += add_variant_step(folder_path, variant, candidates, pad_id, fp32_step_file(manifest))
    return add_variant(folder_path, manifest, variant, written, make_default)

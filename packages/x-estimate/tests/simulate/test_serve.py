"""``python -m x_estimate.simulate.serve``: the runtime's memory guard asks it for the step it runs."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

transformers = pytest.importorskip("transformers")

from x_estimate.model.skeleton import model_of_class  # noqa: E402
from x_estimate.simulate.serve import serve  # noqa: E402
from x_estimate.simulate.step import simulate_training  # noqa: E402

CONFIG = transformers.LlamaConfig(
    hidden_size=64, intermediate_size=172, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=1000,
).to_dict()  # fmt: skip
REQUEST = {"model_class": "LlamaForCausalLM", "config": CONFIG, "precision": "fp32", "optimizer": "adamw",
           "batch_size": 2, "seq_len": 32, "checkpointing": False, "attn_implementation": "sdpa", "device": "cpu"}  # fmt: skip


def _answers(*lines: str) -> list[dict]:
    out = io.StringIO()
    serve(io.StringIO("".join(line + "\n" for line in lines)), out)
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_an_answer_is_the_simulated_step() -> None:
    (found,) = _answers(json.dumps({"id": 7, **REQUEST}))
    model = model_of_class("LlamaForCausalLM", CONFIG)
    step = simulate_training(model, model.config, precision="fp32", optimizer="adamw", batch_size=2, seq_len=32,
                             attn_implementation="sdpa")  # fmt: skip
    peak, parts, steady = step.sharded({})
    assert found["id"] == 7
    assert (found["peak"], found["parts"], found["steady"], found["reserved"]) == (peak, parts, steady, None)
    # Weights and buffers (the rotary inv_freq), float32.
    assert found["parts"]["weights"] == sum(t.numel() * 4 for t in [*model.parameters(), *model.buffers()])


def test_bad_requests_get_one_line_each_and_the_server_goes_on() -> None:
    unknown = json.dumps({"id": 1, **REQUEST, "model_class": "NoSuchForCausalLM"})
    answers = _answers("{not json", unknown, json.dumps({"id": 2, **REQUEST}))
    assert answers[0]["error"].startswith("not a JSON request")
    assert answers[1]["id"] == 1 and answers[1]["error"].endswith("has no model class NoSuchForCausalLM")
    assert answers[2]["id"] == 2 and answers[2]["peak"] > 0


def test_the_module_answers_over_a_pipe_with_nothing_else_on_stdout() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "x_estimate.simulate.serve"],
        input=json.dumps({"id": 3, **REQUEST}) + "\n" + json.dumps({"id": 4, **REQUEST, "seq_len": 64}) + "\n",
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    first, second = (json.loads(line) for line in done.stdout.splitlines())
    assert (first["id"], second["id"]) == (3, 4)
    assert second["parts"]["logits"] == 2 * first["parts"]["logits"]  # twice the tokens, twice the logits

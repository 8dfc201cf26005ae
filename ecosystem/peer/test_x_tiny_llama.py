"""Written into transformers' tests/ by ecosystem/peer_suites.py: its ModelTesterMixin on a tiny Llama.

transformers' sdist ships the common model tests (``ModelTesterMixin``) but no model's tester; this one
builds a 2-layer Llama from its config (nothing downloaded), so the common tests (save/load, forward
shapes, attention and hidden-state outputs, gradient checkpointing, resizing, ...) run with the real
Accelerate and with x serving it.
"""

import unittest

from transformers import LlamaConfig, LlamaForCausalLM, LlamaModel

from .test_modeling_common import ModelTesterMixin, ids_tensor, random_attention_mask


class TinyLlamaTester:
    batch_size = 2
    seq_length = 7
    is_training = True
    vocab_size = 97
    hidden_size = 32
    num_hidden_layers = 2
    num_attention_heads = 4
    num_key_value_heads = 2
    intermediate_size = 37

    def __init__(self, parent: unittest.TestCase) -> None:
        self.parent = parent

    def get_config(self) -> LlamaConfig:
        return LlamaConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            intermediate_size=self.intermediate_size,
            max_position_embeddings=64,
            pad_token_id=0,
        )

    def prepare_config_and_inputs_for_common(self):
        ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
        return self.get_config(), {
            "input_ids": ids,
            "attention_mask": random_attention_mask([self.batch_size, self.seq_length]),
        }


class TinyLlamaCommonTest(ModelTesterMixin, unittest.TestCase):
    all_model_classes = (LlamaModel, LlamaForCausalLM)
    test_torch_exportable = False

    def setUp(self) -> None:
        self.model_tester = TinyLlamaTester(self)

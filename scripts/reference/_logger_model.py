"""What upstream's logger callbacks read of a model, shared by the logger references
(wandb_callback.py, trackio_callback.py): a model with a `config` and `num_parameters()`,
and the tiny GPT-2 config they log."""

from transformers import GPT2Config


class Model:
    """What the callback reads of a model: its `config` and `num_parameters()`."""

    def __init__(self, config, n):
        self.config = config
        self.n = n

    def num_parameters(self):
        return self.n


def model_config():
    return GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1000, num_labels=3)

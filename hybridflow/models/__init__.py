"""Models: loading from Hugging Face folders, the tiny test model, critic and reward heads, packing
(remove padding), chunked log-prob/entropy, LoRA, gradient checkpointing and torch.compile.

Import the submodules directly (``from hybridflow.models.log_probs import forward_log_probs``); this
package imports nothing so that lightweight users do not pay for transformers.
"""

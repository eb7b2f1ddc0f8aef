"""hybridflow: RL post-training for LLMs on the HybridFlow design (arXiv 2409.19256)."""

import os

# On a busy CPU torch's spin-waiting OpenMP threads run 5-10x slower; this must be set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

__version__ = "0.1.0"

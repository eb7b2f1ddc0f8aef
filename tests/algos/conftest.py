"""One torch thread: the machine's 2 cores are shared and these tensors are tiny."""

import torch

torch.set_num_threads(1)

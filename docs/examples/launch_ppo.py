"""main_ppo with your own registered estimator and scoring function: import them, then run the trainer.

    PYTHONPATH=docs/examples python docs/examples/launch_ppo.py algorithm.adv_estimator=batch_mean ...

Both run in this driver process, so importing them here is enough. A policy loss or a tool runs inside
the worker processes instead (see docs/extending.md).
"""

import batch_mean_advantage  # noqa: F401  registers algorithm.adv_estimator=batch_mean
import reverse_word_scoring  # noqa: F401  registers data_source reverse_word

from hybridflow.trainer.main_ppo import main

if __name__ == "__main__":
    main()

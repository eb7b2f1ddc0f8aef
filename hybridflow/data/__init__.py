"""Data for RL and SFT. Import from the modules (this package imports nothing, so the preprocessing
scripts that only write parquet do not pay for torch):

- ``rl_dataset``: ``RLDataset`` — verl-schema parquet rows, chat-templated, over-long prompts handled
- ``collate``: ``collate_to_dataproto`` — left-padded prompt batches as DataProto
- ``sampler``: ``StatefulDataLoader`` — seeded, resumable batches
- ``synthetic``: arithmetic, countdown and sorting problems; ``parquet_io``: writing rows to parquet
"""

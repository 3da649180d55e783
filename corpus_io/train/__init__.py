"""Training, decoding and scoring: a compact Conformer-CTC trained from the corpus-io loader.

Modules: ``model`` (ConformerCTC, the hybrid ConformerCTCAttention, and the model interface), ``steps``
(one forward + loss for training and validation, the micro- and optimizer steps), ``optim`` (optimizer
and scheduler builders), ``metrics`` (sums reduced across ranks, TensorBoard, log lines), ``distributed``
(torchrun/env:// set-up and collectives), ``checkpoint`` (atomic save, RNG state, pruning, averaging),
``init_param`` (starting from another run's weights: fine-tuning), ``trainer`` (the DDP training loop),
``output_dir`` (a run's output_dir claimed), ``trained_keys`` (debug key records),
``frontend`` (features on the model's device), ``cmvn`` (global CMVN stats), ``decode`` (the model over a
list, a ``corpus_io.decoding`` search, the report), ``tune_lm`` (LM weights on a dev list), ``scoring``
(CER/WER).
"""

"""Training, decoding and scoring: a compact Conformer-CTC trained from the corpus-io loader.

Modules: ``model`` (ConformerCTC and the model interface), ``cmvn`` (global CMVN stats),
``distributed`` (torchrun/env:// set-up and collectives), ``checkpoint`` (atomic save, pruning,
averaging), ``trainer`` (the DDP training loop), ``decode`` (greedy CTC), ``scoring`` (CER/WER).
"""

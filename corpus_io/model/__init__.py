"""The model, shared by training and by every door that runs it.

Modules: ``model`` (ConformerCTC, the hybrid ConformerCTCAttention, and the model interface), ``conformer``
(the encoder blocks), ``frontend`` (features and SpecAugment on the model's device), ``cmvn`` (global CMVN
stats), ``checkpoint`` (the checkpoint format: atomic save, load, RNG state, pruning, averaging).
"""

"""Decoding search, apart from training: CTC prefix beam search, n-gram LMs, hotwords, attention rescoring."""

"""The model's doors: everything that runs a trained model on audio.

Modules: ``decode`` (the model over a list, a :mod:`corpus_io.decoding` search, the report), ``transcribe``
(streaming, chunk by chunk), ``export`` (TorchScript/ONNX files for serving), ``exported`` (loading those
files back), ``sherpa`` (serving with sherpa-onnx), ``tune_lm`` (LM weights on a dev list).
Scoring (CER/WER) is :mod:`corpus_io.decoding.scoring`, which training's validation uses too.
"""

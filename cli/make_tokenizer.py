from cli._app import command
from corpus_io.config import MakeTokenizerConfig


@command("make-tokenizer", MakeTokenizerConfig,
         "Build a token list (char/word) or train a sentencepiece model (bpe) from Kaldi text or JSONL.")
def make_tokenizer(cfg: MakeTokenizerConfig) -> None:
    from corpus_io.tokenizer import make_tokenizer as run

    run(cfg)


main = make_tokenizer.standalone

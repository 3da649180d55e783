from cli._app import command
from corpus_io.config import PrepareConfig


@command("prepare", PrepareConfig,
         "Prepare a corpus from its distributed layout (AISHELL-1, LibriSpeech) into sorted Kaldi dirs "
         "<output_dir>/<split>/{wav.scp,text,utt2spk,spk2utt}. Audio without a transcript is counted and left out.")
def prepare(cfg: PrepareConfig) -> None:
    from corpus_io.corpora import prepare as run

    run(cfg)


main = prepare.standalone

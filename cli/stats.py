from cli._app import command
from corpus_io.config import StatsConfig


@command("stats", StatsConfig,
         "Corpus statistics of a shard or raw data.list: hours, utterances, duration/text-length/speaker "
         "histograms, per-shard balance (a table on stdout) and a PNG duration histogram. Reads metadata only.")
def stats(cfg: StatsConfig) -> None:
    from corpus_io.stats import run_stats

    run_stats(cfg)


main = stats.standalone

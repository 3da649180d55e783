"""The command line: thin typer wrappers that compose a config and call corpus_io."""

"""Tar shards: format, writer, streaming reader, index, pack-shards, make-datalist, verify-shards."""

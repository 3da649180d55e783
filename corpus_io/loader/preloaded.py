"""Imported last by the forkserver, after its preload: a worker's garbage collector never walks what it made.

``gc.freeze()`` puts every object the forkserver holds into the garbage collector's permanent generation, which
no collection in a forked worker walks: a full collection writes to each object it visits, so without this every
worker soon holds its own copy of the pages of torch's and the readers' Python objects (copy-on-write) instead of
sharing the forkserver's (issue 53). Imported nowhere else: in any other process it would freeze that one."""

import gc

gc.collect()
gc.freeze()

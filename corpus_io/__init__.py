"""corpus-io: prepare speech corpora of any size and stream them into training.

Importing the package is cheap: nothing here imports torch. Modules that need
torch (the loader, training) import it themselves.
"""

__version__ = "0.1.0"

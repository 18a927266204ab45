"""EN→FR parallel corpus builder: pinned Debian packages and wheels → French gettext catalogs → clean splits.

Run `python -m model_export.corpus build --out data/corpus`; the pipeline lives in `build.py`.
"""


class CorpusError(RuntimeError):
    """A corpus build or tokenizer step failed; the message is meant for the command line."""

"""The one error the offline commands raise on bad input; the CLI prints it as a single line."""


class ExportError(Exception):
    """A checkpoint, model folder or argument that cannot be used, with what to change."""

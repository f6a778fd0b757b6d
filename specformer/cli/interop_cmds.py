"""Commands of this area are registered on the shared app here."""

from specformer.cli.app import app  # noqa: F401

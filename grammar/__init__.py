"""The `.grad` grammar (`grad.lark`), shipped as package data."""
from importlib import resources


def grammar_text() -> str:
    return resources.files(__name__).joinpath("grad.lark").read_text()

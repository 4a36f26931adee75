"""Code generated from the contract (do not edit by hand): ``structs.py``, the msgspec
structs of the models, written by ``runstate.schemas.structs``."""

"""The SDK's own copy of Writ's wire schemas (clients/python/copy_wire.py)."""

"""A tiny third-party driver packaged by the tests."""

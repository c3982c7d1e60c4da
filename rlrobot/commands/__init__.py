"""Commands of the ``rlrobot`` CLI that are applications rather than library parts (``collect``)."""

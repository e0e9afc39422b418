"""The one C extension; everything else is in pyproject.toml.

``kvtier.block._xxh3copy`` copies a payload and takes its checksum in one
pass (reads from RAM tiers).  It is optional: where it cannot be built (no C
compiler) the install goes on, and :mod:`kvtier.block.framing` does the same
work in two passes in Python.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("kvtier.block._xxh3copy", ["sdk/block/_xxh3copy.c"], optional=True),
    ]
)

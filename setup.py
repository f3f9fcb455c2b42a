"""The one thing pyproject.toml cannot say: the placement engine's optional C kernel.

``gpusched_core/placement/_kernel.c`` computes fragmentation growth node by node (see ``kernel.py``). It
is optional: where no C compiler is found the install succeeds without it and numpy does the same work.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "gpusched_core.placement._kernel",
            ["libs/core/gpusched_core/placement/_kernel.c"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)

"""The one thing pyproject.toml cannot say: the placement engine's optional C kernel.

``gpusched_core/placement/_kernel.c`` computes fragmentation growth node by node (see ``kernel.py``). It
is optional: where no C compiler is found the install succeeds without it and numpy does the same work.
"""

import hashlib
from pathlib import Path

from setuptools import Extension, setup

SOURCE = "libs/core/gpusched_core/placement/_kernel.c"
# the source the extension is built from, compiled into it (``_kernel.SOURCE``): a build that fails keeps the
# last one in place, and the unit suite tells a kernel older than its source by this
DIGEST = hashlib.sha256((Path(__file__).parent / SOURCE).read_bytes()).hexdigest()[:16]

setup(
    ext_modules=[
        Extension(
            "gpusched_core.placement._kernel",
            [SOURCE],
            define_macros=[("KERNEL_SOURCE", f'"{DIGEST}"')],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)

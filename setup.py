"""The package layout pyproject.toml cannot state: the repository's params/ installs as
`tensorpipe.params`.

The registered experiment params sit in params/ at the top of the repository, apart from the
library (as Lingvo keeps lingvo/tasks apart from lingvo/core). Installed, they become TensorPipe's
subpackage `tensorpipe.params`, so the wheel puts no generic top-level `params` into site-packages;
tensorpipe.trainer.registry finds them under either name and keys them alike (--model=digits.X).
Everything else about the distribution (name, metadata, dependencies, scripts) is in
pyproject.toml.
"""

import setuptools

setuptools.setup(
    packages=(setuptools.find_packages(include=['tensorpipe', 'tensorpipe.*']) +
              ['tensorpipe.params']),
    package_dir={'tensorpipe.params': 'params'},
)

"""Maps the repository's top-level folders into the installed ``intellect_node`` namespace.

Everything else about the package is in pyproject.toml; only this mapping needs code, because
setuptools' declarative ``packages.find`` cannot rename what it finds.
"""

from setuptools import find_packages, setup

FOLDERS = ("node", "protocol", "crypto", "cli")

setup(
    packages=[f"intellect_node.{name}" for name in find_packages(include=[f"{f}*" for f in FOLDERS])],
    package_dir={f"intellect_node.{folder}": folder for folder in FOLDERS},
)

"""The wheel's platform tag: a wheel that carries the server binary (`modelmux/_bin/modelmux`,
put there by scripts/build-python-wheel) runs only on the platform it was built for, so it is
tagged `py3-none-<platform>`; without the binary the package is pure Python."""

from pathlib import Path

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel

_BINARY = Path(__file__).resolve().parent / "modelmux" / "_bin" / "modelmux"


class PlatformWheel(bdist_wheel):
    """Tags the wheel for this platform when it carries the binary."""

    def finalize_options(self) -> None:
        super().finalize_options()
        self.root_is_pure = not _BINARY.exists()

    def get_tag(self) -> tuple[str, str, str]:
        python, abi, platform = super().get_tag()
        return (python, abi, platform) if self.root_is_pure else ("py3", "none", platform)


setup(cmdclass={"bdist_wheel": PlatformWheel})

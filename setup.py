"""The one thing pyproject.toml cannot say: the wheel also puts ``neuron_exporter_autostart.pth`` at the top of
site-packages, the only place Python reads ``.pth`` files from (what it does: neuron_exporter/training/autostart.py)."""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = os.path.join("neuron_exporter", "training", "autostart_path", "neuron_exporter_autostart.pth")


class BuildPy(build_py):
    def run(self):
        super().run()
        if not self.editable_mode:  # an editable install has no build tree to copy into (see the Makefile)
            self.copy_file(PTH, os.path.join(self.build_lib, os.path.basename(PTH)), preserve_mode=False)

    def get_outputs(self, include_bytecode=True):
        outputs = super().get_outputs(include_bytecode)
        return outputs if self.editable_mode else [*outputs, os.path.join(self.build_lib, os.path.basename(PTH))]


setup(cmdclass={"build_py": BuildPy})

"""TensorPipe: GPipe-style pipeline parallelism for Lingvo."""
import setuptools

setuptools.setup(
    name='tensorpipe',
    version='0.1.0',
    description='GPipe-style pipeline parallelism for Lingvo/TensorFlow.',
    packages=setuptools.find_packages(include=['tensorpipe', 'tensorpipe.*', 'params', 'params.*']),
    python_requires='>=3.11,<3.12',
)

"""Stand-in for torchvision in the oracle venv: the names SGLang's import chain binds, nothing that works.

SGLang 0.5.10 imports ``torchvision.io.decode_jpeg`` (utils/common.py) and ``torchvision.transforms``
(multimodal/internvl_utils.py, reached from configs/__init__.py) when ``server_args`` is imported; it
calls them only to process images, which the oracle never does. PyPI's torchvision is built against
CUDA PyTorch and does not load with the CPU PyTorch the oracle uses (``operator torchvision::nms does
not exist``), and no CPU build is reachable from here. Every call fails, naming this file.
"""


class MissingTorchvision(NotImplementedError):
    pass


def missing(name: str):
    def call(*_args, **_kwargs):
        raise MissingTorchvision(f"torchvision.{name}: the SGLang oracle's torchvision is a stand-in "
                                 "(tests/oracle/standins); it judges arguments, not images.")
    return call

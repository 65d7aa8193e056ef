from torchvision import missing


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return missing(f"transforms.{name}")

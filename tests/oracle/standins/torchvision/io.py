from torchvision import missing

decode_jpeg = missing("io.decode_jpeg")

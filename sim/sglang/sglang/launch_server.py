"""Entry point, as in SGLang: `python -m sglang.launch_server --model-path ... --tp-size 8 ...`."""

from sglang._sim.server import main

if __name__ == "__main__":
    main()

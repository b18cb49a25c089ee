"""vstack pin: show the pinned base and check the vllm/ checkout against it."""

from __future__ import annotations

from vstack.base import check_submodule
from vstack.config import Project
from vstack.submodule import current_gitlink, gitmodules_url


def cmd_pin(project: Project) -> int:
    pin = project.pin
    print(f"vLLM     {pin.version} (commit {pin.commit})")
    print(f"wheel    {pin.wheel}")
    print(f"sha256   {pin.sha256}")
    print(f"image    {pin.image_ref}")
    if gitmodules_url(project):
        link = current_gitlink(project)
        if link is None:
            state = "none (`vstack pin --submodule` writes it)"
        elif link.startswith(pin.short_hash):
            state = f"{link} (the pinned commit)"
        else:
            state = f"{link}: NOT the pinned commit (`vstack pin --submodule`)"
        print(f"gitlink  {state}")
    head = check_submodule(project, pin)
    if head is None:
        print("vllm/    not populated: the base comes from the pinned wheel")
    else:
        print(f"vllm/    at {head[:12]}, matches the pin")
    return 0

"""Image folders on disk (``root/<class>/<image>``): the images read whole, each file checked as
the folder is listed (`image_folder`), one line naming a file that cannot be read."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from reproduce.data.examples import DataError

__all__ = ["image_folder", "is_image_folder", "read_image"]


def is_image_folder(path: Path) -> bool:
    """Whether ``path`` is a folder that holds folders (one per class)."""
    return path.is_dir() and any(p.is_dir() for p in path.iterdir())


def read_image(path: str):
    """The RGB image at ``path`` (torchvision's ``pil_loader``), read whole: an image that cannot be
    decoded (truncated, not an image, or past PIL's decompression-bomb limit) is an
    `OSError` naming the file, as an unreadable file is.

    Args:
        path: the image file.

    Returns:
        A ``PIL.Image.Image`` in RGB.

    Raises:
        OSError: the file cannot be read or decoded (its ``filename`` is ``path``).
    """
    from PIL import Image

    try:
        with open(path, "rb") as f, Image.open(f) as img:
            return img.convert("RGB")  # decodes every pixel: a truncated file fails here
    except OSError as e:
        if e.filename:
            raise
        raise OSError(e.errno, f"cannot decode the image {path!r}: {e}", path) from None
    except (Image.DecompressionBombError, ValueError, SyntaxError) as e:
        raise OSError(None, f"cannot decode the image {path!r}: {e}", path) from None


class _ImageFiles:
    """ImageFolder's ``is_valid_file``: a file with an image's extension, which must be a regular
    file (a FIFO, socket or device would block or fail the first read of it, after start-up) reached
    once (a folder reached again through a symbolic link would repeat its images)."""

    def __init__(self):
        from torchvision.datasets.folder import IMG_EXTENSIONS

        self.extensions = IMG_EXTENSIONS
        self.folders: dict[str, str] = {}  # real folder -> the path it was first reached by
        self.last = ""

    def __call__(self, path: str) -> bool:
        if not path.lower().endswith(self.extensions):
            return False
        folder = os.path.dirname(path)
        if folder != self.last:  # a new folder: one realpath for all its files
            self.last, real = folder, os.path.realpath(folder)
            if self.folders.setdefault(real, folder) != folder:
                raise DataError(
                    f"{folder!r} is {self.folders[real]!r} again, reached through a symbolic link "
                    "(a loop, or a link to another folder of the data): its images would count "
                    "twice; remove the link"
                )
        try:
            mode = os.stat(path).st_mode
        except OSError as e:
            raise DataError(f"cannot read the data file {path!r}: {e.strerror or e}") from None
        if not stat.S_ISREG(mode):
            raise DataError(
                f"{path!r} is not a regular file (a FIFO, socket, device or folder named as an "
                "image); remove it from the data folder"
            )
        return True


def image_folder(root: Path):
    """The ImageFolder data set of ``root`` (``root/<class>/<image>``, images read by
    `read_image`), its files checked as it lists them: each a regular file, each folder reached once.

    Args:
        root: the split's folder.

    Returns:
        A ``torchvision.datasets.ImageFolder``.

    Raises:
        DataError: a file that is not a regular file, an entry that cannot be read (a symbolic link
            loop), or a folder reached twice (the message names it).
    """
    from torchvision.datasets import ImageFolder

    try:
        with os.scandir(root) as entries:  # the class folders, as ImageFolder lists them
            for entry in entries:
                entry.is_dir()  # a symbolic link loop fails here
    except OSError as e:
        raise DataError(f"cannot read the data {e.filename!r}: {e.strerror or e}") from None
    try:
        return ImageFolder(str(root), loader=read_image, is_valid_file=_ImageFiles())
    except OSError as e:  # listing the classes: an entry that cannot be read
        where = f" {e.filename!r}" if e.filename else f" under {str(root)!r}"
        raise DataError(f"cannot read the data{where}: {e.strerror or e}") from None

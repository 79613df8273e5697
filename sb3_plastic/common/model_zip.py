"""Reading the ``data`` entry of a model zip written by SB3's ``save``, with SB3's clear errors for bad files.

SB3 2.9's ``load_from_zip_file`` turns a file that is not a zip into ``ValueError("Error: the file ... wasn't a
zip-file")``; a zip without a ``data`` entry (a truncated file, in which Python's ``zipfile`` may find the inner
zip of one of the ``.pth`` entries, or another zip) ends in SB3's ``AssertionError("No data found in the saved
file")``. The plastic algorithms read the ``data`` entry before SB3 does (to recognise a zip saved by the SB3
class, :func:`sb3_plastic.common.plastic_algorithm.sb3_zip_objects`), and the launcher checks ``-i model.zip``
before rl_zoo3 loads it: both raise ``ValueError`` naming the file and what is wrong with it.
"""

from __future__ import annotations

import io
import zipfile
from typing import Any, Optional

from stable_baselines3.common.save_util import json_to_data, open_path


def _read_data_text(archive: zipfile.ZipFile, path: Any) -> str:
    names = archive.namelist()
    if "data" not in names:
        shown = names[:6] + (["..."] if len(names) > 6 else [])
        raise ValueError(
            f"Error: the file {path} is not a whole model zip written by save(): it has no 'data' entry (its "
            f"entries: {shown}); the file is probably truncated, or another zip"
        )
    return archive.read("data").decode()


def read_data_text(path: Any) -> str:
    """The ``data`` entry of the model zip ``path`` (a path, or an open binary file whose position is restored).

    :raises ValueError: for a file that is not a zip (SB3's message: "wasn't a zip-file"), or a zip without the
        ``data`` entry SB3's ``save`` writes (a truncated file, or another zip).
    """
    try:
        if isinstance(path, io.IOBase):
            position = path.tell()
            try:
                with zipfile.ZipFile(path) as archive:
                    return _read_data_text(archive, path)
            finally:
                path.seek(position)
        with open_path(path, "r", verbose=0, suffix="zip") as file, zipfile.ZipFile(file) as archive:
            return _read_data_text(archive, path)
    except zipfile.BadZipFile as exc:
        raise ValueError(f"Error: the file {path} wasn't a zip-file ({exc})") from exc


def read_data(path: Any, custom_objects: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """The ``data`` entry of an SB3 model zip, deserialised as SB3's ``load`` does (``custom_objects`` replace saved
    entries). Raises as :func:`read_data_text`."""
    return json_to_data(read_data_text(path), custom_objects=custom_objects)

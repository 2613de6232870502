"""Secrets kept in the database (a model endpoint's credential): sealed with a key derived from
SECRET_KEY, so a database dump, a backup or a logged SQL parameter shows ciphertext only. Opening
also tries SECRET_KEY_FALLBACKS, so rotating SECRET_KEY the documented Django way keeps every
sealed secret readable; a secret sealed under a key no longer configured cannot be opened
(SecretUnreadable) and must be entered again."""

import base64
import functools
import hashlib

from django.conf import settings

_PURPOSE = b"warden.config.secrets:v1:"


class SecretUnreadable(ValueError):
    pass


@functools.cache
def _keys(secret_key: str, fallbacks: tuple[str, ...]):
    # Imported here: only processes that seal or open a secret pay for it (~30 ms).
    from cryptography.fernet import Fernet, MultiFernet

    return MultiFernet([Fernet(base64.urlsafe_b64encode(hashlib.sha256(_PURPOSE + key.encode()).digest()))
                        for key in (secret_key, *fallbacks)])


def _current():
    return _keys(settings.SECRET_KEY, tuple(getattr(settings, "SECRET_KEY_FALLBACKS", ()) or ()))


def secret_seal(plain: str) -> str:
    """`plain` sealed under the current SECRET_KEY (a different text every time)."""
    return _current().encrypt(plain.encode()).decode()


@functools.lru_cache(maxsize=256)
def _opened(sealed: str, keys) -> str:
    return keys.decrypt(sealed.encode()).decode()


def secret_open(sealed: str) -> str:
    """What `secret_seal` sealed; memoized per sealed text (a worker opens the same one every call)."""
    from cryptography.fernet import InvalidToken

    try:
        return _opened(sealed, _current())
    except (InvalidToken, ValueError) as error:
        raise SecretUnreadable("sealed under a key that is no longer configured (SECRET_KEY, SECRET_KEY_FALLBACKS)") from error

"""The HTTP service (`gradfuse serve`): a thin FastAPI shell over `gradfuse.Workspace`, plus its web page."""

from gradfuse.server.settings import API_KEY_ENV, ServerSettings

__all__ = ["API_KEY_ENV", "ServerSettings", "create_app"]


def __getattr__(name: str):
    # FastAPI is imported only by whoever serves: the library and CLI load without it.
    if name == "create_app":
        from gradfuse.server.app import create_app

        return create_app
    raise AttributeError(name)

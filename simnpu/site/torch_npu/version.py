from _simnpu import API_VERSION as _v

__version__ = _v + '+simulated'
del _v

__version__ = '2.9.0.post2+simulated'

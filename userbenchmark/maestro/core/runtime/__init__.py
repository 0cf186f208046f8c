"""core/runtime"""

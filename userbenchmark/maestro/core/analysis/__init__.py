"""core/analysis"""

#include <immintrin.h>
#include <stdio.h>
#include <time.h>
#include <pthread.h>
#define N 200000000L
static void* run(void* _) {
  __m512 a[12]; __m512 b=_mm512_set1_ps(1.0000001f), c=_mm512_set1_ps(1e-9f);
  for(int i=0;i<12;i++) a[i]=_mm512_set1_ps((float)i);
  for(long n=0;n<N/12;n++) for(int i=0;i<12;i++) a[i]=_mm512_fmadd_ps(a[i],b,c);
  float s=0; for(int i=0;i<12;i++) s+=_mm512_reduce_add_ps(a[i]);
  static volatile float sink; sink=s; return 0;
}
int main(int argc,char**argv){ int T=argc>1?atoi(argv[1]):1; pthread_t t[256]; struct timespec s,e;
  clock_gettime(CLOCK_MONOTONIC,&s); for(int i=0;i<T;i++) pthread_create(&t[i],0,run,0); for(int i=0;i<T;i++) pthread_join(t[i],0);
  clock_gettime(CLOCK_MONOTONIC,&e); double sec=(e.tv_sec-s.tv_sec)+(e.tv_nsec-s.tv_nsec)*1e-9;
  printf("%d threads: %.1f GFLOP/s (zmm FMA)\n",T, (double)(N/12*12)*T*32/sec/1e9); }

#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "engine/sampler.h"
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+1e-9*t.tv_nsec;}
static unsigned long long rs=12345;static double uni(void){rs^=rs<<13;rs^=rs>>7;rs^=rs<<17;return ((rs>>11)+0.5)/9007199254740992.0;}
int main(){int V=129280;float*lg=malloc(4*V),*pr=malloc(4*V);void*sc=malloc(dsv4_sampling_scratch_bytes(V));
 struct{const char*n;int mode;float t,p;int k;}cs[]={{"flat uniform logits, top_p 0.999",0,1,0.999f,0},{"all-equal logits, top_p 0.5",1,1,0.5f,0},
 {"all-equal logits, top_k 129279",1,1,1,129279},{"gauss sigma1, top_k 100000",2,1,1,100000},{"gauss sigma1, top_k 100000 + top_p 0.99",2,1,0.99f,100000},
 {"descending-by-id logits, top_p 0.999",3,1,0.999f,0},{"ascending-by-id logits, top_k 60000",4,1,1,60000},{"organ-pipe logits, top_k 64640",5,1,1,64640}};
 for(int c=0;c<8;c++){for(int v=0;v<V;v++){double x; switch(cs[c].mode){case 0:x=uni();break;case 1:x=0;break;case 2:x=sqrt(-2*log(uni()))*cos(6.283*uni());break;case 3:x=-v*1e-5;break;case 4:x=v*1e-5;break;default:x=(v<V/2?v:V-v)*1e-5;} lg[v]=(float)x;}
  dsv4_sampling s;dsv4_sampling_default(&s);s.temperature=cs[c].t;s.top_p=cs[c].p;s.top_k=cs[c].k;
  double t0=now();int R=5;for(int r=0;r<R;r++)dsv4_sampling_probs(&s,lg,V,NULL,0,NULL,0,pr,sc);double ms=(now()-t0)/R*1e3;int kept=0;for(int v=0;v<V;v++)kept+=pr[v]>0;
  printf("%-44s %8.2f ms/row kept %d\n",cs[c].n,ms,kept);}
}
